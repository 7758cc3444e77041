package txproducer

import (
	"reflect"
	"unsafe"

	"github.com/apache/rocketmq-client-go/v2"
)

// stopCheckLoop ends rocketmq-client-go's check goroutine, which ranges over
// an internal channel that the client never closes (one leaked goroutine
// per producer lifecycle). It closes that channel after Shutdown, found by
// reflection on the pinned client version; if the layout differs it does
// nothing. A check request still being decoded when it closes would panic
// on send inside a client goroutine that recovers panics.
func stopCheckLoop(tp rocketmq.TransactionProducer) {
	defer func() { _ = recover() }()
	v := reflect.ValueOf(tp)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return
	}
	dp := v.Elem().FieldByName("producer")
	if !dp.IsValid() || dp.Kind() != reflect.Pointer || dp.IsNil() {
		return
	}
	ch := dp.Elem().FieldByName("callbackCh")
	if !ch.IsValid() || ch.Kind() != reflect.Chan || ch.IsNil() {
		return
	}
	reflect.NewAt(ch.Type(), unsafe.Pointer(ch.UnsafeAddr())).Elem().Close()
}
