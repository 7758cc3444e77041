package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
)

// ErrNoHeartbeat: the client's layout is not the one HeartbeatBroker knows,
// so nothing was sent.
var ErrNoHeartbeat = errors.New("broker: the client offers no per-broker heartbeat")

// The remoting protocol's values for a heartbeat request (rocketmq-client-go
// internal/request.go and internal/remote/codec.go of the pinned version).
const (
	reqHeartbeat    = 34
	languageGo      = 9
	protocolVersion = 317
)

// hbOpaque numbers the heartbeats heartbeatBroker sends. The client
// numbers its own requests upward from 1 and matches a response to its
// request by that number, per client; these count downward from -1, so
// the two meet only after the client sent more than 2^31 requests on one
// connection, and then only if one of each were in flight at that moment.
var hbOpaque atomic.Int32

// heartbeatBody is the client's heartbeat JSON for one producer group and
// no consumer (the broker keeps the consumers that heartbeats of this
// client's other members registered: it never unregisters on a heartbeat).
type heartbeatBody struct {
	ClientID  string          `json:"clientID"`
	Producers []producerGroup `json:"producerDataSet"`
	Consumers []struct{}      `json:"consumerDataSet"`
}

type producerGroup struct {
	GroupName string `json:"groupName"`
}

// heartbeatBroker sends one HEART_BEAT for group to addr through the
// client's InvokeSync, so it travels on the client's own connection to addr
// (opened if needed) and the broker's checks come back on it.
//
// Upstream lacks it (no upstream issue found): the client heartbeats only
// the masters in its route table, which drops a broker that left the name
// server's routes and gets it back only once the broker registers there
// again (a restarted broker: seconds after it starts checking), and which
// never holds a slave that the controller is about to promote. The request
// is built by reflection on the unmodified upstream layout (the internal
// RemotingCommand's exported fields; see internalClient), and
// TestHeartbeatBrokerRegistersOffRoute fails when an upgrade changes it.
func heartbeatBroker(ctx context.Context, tp rocketmq.TransactionProducer, group, addr string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = ErrNoHeartbeat
		}
	}()
	c := internalClient(tp)
	if c == nil {
		return ErrNoHeartbeat
	}
	cv := reflect.ValueOf(c)
	invoke, idm := cv.MethodByName("InvokeSync"), cv.MethodByName("ClientID")
	if !invoke.IsValid() || !idm.IsValid() || invoke.Type().NumIn() != 4 || invoke.Type().NumOut() != 2 ||
		idm.Type().NumIn() != 0 || idm.Type().NumOut() != 1 || idm.Type().Out(0).Kind() != reflect.String {
		return ErrNoHeartbeat
	}
	clientID := idm.Call(nil)[0].String()
	body, err := json.Marshal(heartbeatBody{ClientID: clientID, Producers: []producerGroup{{GroupName: group}}, Consumers: []struct{}{}})
	if err != nil {
		return fmt.Errorf("broker: heartbeat body: %w", err)
	}
	ct := invoke.Type().In(2)
	if ct.Kind() != reflect.Pointer || ct.Elem().Kind() != reflect.Struct {
		return ErrNoHeartbeat
	}
	cmd := reflect.New(ct.Elem())
	set := func(name string, v any) bool {
		f := cmd.Elem().FieldByName(name)
		if !f.IsValid() || !f.CanSet() {
			return false
		}
		val := reflect.ValueOf(v)
		if !val.CanConvert(f.Type()) {
			return false
		}
		f.Set(val.Convert(f.Type()))
		return true
	}
	if !set("Code", int16(reqHeartbeat)) || !set("Language", uint8(languageGo)) || !set("Version", int16(protocolVersion)) ||
		!set("Opaque", hbOpaque.Add(-1)) || !set("ExtFields", map[string]string{}) || !set("Body", body) {
		return ErrNoHeartbeat
	}
	timeout := 3 * time.Second
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := invoke.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(addr), cmd, reflect.ValueOf(timeout).Convert(invoke.Type().In(3))})
	if e, _ := out[1].Interface().(error); e != nil {
		return fmt.Errorf("broker: heartbeat to %s: %w", addr, e)
	}
	resp := out[0]
	if resp.Kind() != reflect.Pointer || resp.IsNil() {
		return fmt.Errorf("broker: heartbeat to %s: no response", addr)
	}
	code, remark := resp.Elem().FieldByName("Code"), resp.Elem().FieldByName("Remark")
	if !code.IsValid() || !code.CanInt() {
		return ErrNoHeartbeat
	}
	if code.Int() != 0 {
		r := ""
		if remark.IsValid() && remark.Kind() == reflect.String {
			r = remark.String()
		}
		return fmt.Errorf("broker: heartbeat to %s: code %d: %s", addr, code.Int(), r)
	}
	return nil
}
