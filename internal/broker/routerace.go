package broker

import (
	"context"
	"reflect"
	"strings"
)

// The client's route race (upstream; client patch 9 in
// third_party/rocketmq-client-go/PATCHES.md fixes it in rmqtx's own build):
// when the client learns a topic's route, it hands the topic's queues to
// its producers before it records the addresses of the topic's brokers,
// both under its route lock. A send that finds the queues in that moment
// finds no address for their broker and fails at once with "topic=...
// route info not found", before anything is sent and without the client's
// own retries. A service built with the upstream client (every service
// that does not copy the patches) meets it on its first concurrent sends to
// a topic.
//
// settleRoute waits the race out instead of guessing: it asks the client
// for topic's route itself (UpdateTopicRouteInfo), which takes the same
// route lock, so it returns only after the update that raced has recorded
// the addresses. The send is then made once more and finds them. A broker
// whose master is away fails the same way (its queue is known, its master
// address is not); the second send may find a promoted master, or fails
// the same way, which is transient for every caller.
//
// The client words the two "no route" failures differently, and only one
// is the race: "topic=T route info not found" when it found a queue but no
// address for its broker, "the topic=T route info not found" when it found
// no queue at all, after asking the name server itself (a topic no name
// server knows, or no name server answering). The second is returned as it
// is: asking again would only repeat the client's own query, and with a
// name server that does not answer, double the time the send takes.

// isRouteRace reports whether err is the client's "topic=T route info not
// found": a queue of the topic found, no address for its broker.
func isRouteRace(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "route info not found") && !strings.Contains(msg, "the topic=")
}

// sendSettled runs send; if it met the route race while ctx is live, it
// waits with settle for the route update in progress to finish, and runs
// send once more. Nothing reached a broker on the failed attempt that the
// client's own retries would not also have sent again.
func sendSettled[T any](ctx context.Context, settle func(topic string) bool, topic string, send func() (T, error)) (T, error) {
	res, err := send()
	if !isRouteRace(err) || ctx.Err() != nil {
		return res, err
	}
	settle(topic)
	return send()
}

// settleRoute asks the client behind producer (a producer or a
// transactional producer of the pinned client) for topic's route from the
// name server under the client's route lock; see the comment above. It
// reports false, having done nothing, when the client's layout differs
// (TestSettleRouteFindsTheClient fails then), and the caller sends once
// more anyway.
func settleRoute(producer any, topic string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	c := clientOf(producer)
	if c == nil {
		return false
	}
	ns := reflect.ValueOf(c).MethodByName("GetNameSrv")
	if !ns.IsValid() || ns.Type().NumIn() != 0 || ns.Type().NumOut() != 1 {
		return false
	}
	srv := ns.Call(nil)[0]
	if srv.Kind() == reflect.Interface {
		srv = srv.Elem()
	}
	update := srv.MethodByName("UpdateTopicRouteInfo")
	if !update.IsValid() || update.Type().NumIn() != 1 || update.Type().In(0).Kind() != reflect.String {
		return false
	}
	update.Call([]reflect.Value{reflect.ValueOf(topic)})
	return true
}

// clientOf returns the client instance (the internal RMQClient) behind a
// producer of the pinned client: the field client of its defaultProducer,
// which a transactionProducer holds in its field producer. Nil when the
// layout differs. Read only, as internalClient does.
func clientOf(producer any) (client any) {
	defer func() {
		if recover() != nil {
			client = nil
		}
	}()
	v := reflect.ValueOf(producer)
	if inner := field(v, "producer"); inner.IsValid() {
		v = inner // a transactional producer: its defaultProducer
	}
	c := field(v, "client")
	if !c.IsValid() || c.Kind() != reflect.Interface || c.IsNil() {
		return nil
	}
	return c.Interface()
}
