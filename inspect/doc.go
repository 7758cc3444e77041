// Package inspect is the read-only view an operator needs at 3 a.m.: where
// is this event? It joins, for one event id (or every event of a business
// key), the transaction log, the outbox, the consume log and failed attempts
// of every consumer group, the dead letters and their replays, and the
// broker's own record found by key: the committed message, the half message
// (re-stored once per check) and a discarded half in
// TRANS_CHECK_MAX_TIME_TOPIC.
//
// The broker lookup speaks the RocketMQ remoting protocol directly
// (QUERY_MESSAGE, code 12, the request behind `mqadmin queryMsgByKey`),
// because rocketmq-client-go has no public API for it. It asks every master
// broker of the cluster, since halves and discarded halves stay on the broker
// that stored them; see RemotingLookup.
//
// It also lists stuck work by age (Stuck) and row counts per table, status
// and group (Stats). Tables that do not exist are reported as missing rather
// than failing, since a service may use only some of rmqtx's parts.
//
// It reads each table through the package that owns it (txlog.Store,
// outbox.Table, consumer.TableNames, replay.TableNames: names, columns,
// states and queries), so a schema change is made in one place.
//
// Every payload goes through a Redactor before it is returned (I10): by
// default Hidden shows only its size. Seeing payload bytes is an explicit
// opt-out (ShowPrefix, Clear). Nothing here writes.
package inspect
