package wire

import (
	"bytes"
	"fmt"
	"testing"
)

func benchEnvelope() Envelope {
	return Envelope{
		EventID: NewEventID(), EventType: "PaymentSucceeded", EventVersion: 1,
		AggregateType: "Order", AggregateID: "order-000123", AggregateVersion: 2,
		BusinessKey: "pay-000123", Headers: map[string]string{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736"},
	}
}

func BenchmarkEncode(b *testing.B) {
	e := benchEnvelope()
	payload := bytes.Repeat([]byte("x"), 512)
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Validate(); err != nil {
			b.Fatal(err)
		}
		_ = e.Properties(payload)
	}
}

func BenchmarkDecode(b *testing.B) {
	props := benchEnvelope().Properties(bytes.Repeat([]byte("x"), 512))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(props); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHash(b *testing.B) {
	for _, size := range []int{256, 4096, 65536} {
		payload := bytes.Repeat([]byte("x"), size)
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				_ = Hash(payload)
			}
		})
	}
}

func BenchmarkNewEventID(b *testing.B) {
	for b.Loop() {
		_ = NewEventID()
	}
}
