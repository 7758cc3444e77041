package rmqtxtest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/rmqtxtest"
)

// exampleProducer starts a raw rocketmq-client-go producer on b; group
// must be unique in the process (the client keeps one instance per
// group and instance name).
func exampleProducer(b *rmqtxtest.Broker, group string) (rocketmq.Producer, error) {
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		producer.WithGroupName(group), producer.WithInstanceName(group),
	)
	if err != nil {
		return nil, err
	}
	return p, p.Start()
}

// A client sends to the broker as to a real one; the test reads what the
// broker stored.
func Example() {
	b, err := rmqtxtest.Start(rmqtxtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	p, err := exampleProducer(b, "example-send")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := primitive.NewMessage("orders", []byte(`{"order":1}`)).WithTag("created").WithKeys([]string{"order-1"})
	if _, err := p.SendSync(ctx, msg); err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range b.Messages("orders") {
		fmt.Println(m.Topic, m.Tags, m.Keys, string(m.Body))
	}
	// Output: orders created [order-1] {"order":1}
}

// Hold keeps a topic's new messages from consumers; Release makes them
// visible, here in reverse order: how a test shows that a consumer copes
// with events that arrive out of order.
func ExampleBroker_Hold() {
	b, err := rmqtxtest.Start(rmqtxtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	b.CreateTopic("accounts", 1)
	p, err := exampleProducer(b, "example-hold")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b.Hold("accounts")
	for _, v := range []string{"v1", "v2", "v3"} {
		if _, err := p.SendSync(ctx, primitive.NewMessage("accounts", []byte(v))); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println("visible while held:", len(b.Messages("accounts")))
	b.Release("accounts", true)
	for _, m := range b.Messages("accounts") {
		fmt.Println(m.QueueOffset, string(m.Body))
	}
	// Output:
	// visible while held: 0
	// 0 v3
	// 1 v2
	// 2 v1
}

// A transaction half whose producer never ends it stays pending until a
// check decides it; CheckNow runs the check at once instead of after the
// broker's transactionTimeOut.
func ExampleBroker_CheckNow() {
	b, err := rmqtxtest.Start(rmqtxtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	p, err := rocketmq.NewTransactionProducer(exampleListener{},
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		producer.WithGroupName("example-check"), producer.WithInstanceName("example-check"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := p.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer p.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("payments", []byte("paid"))); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending:", len(b.Pending()))
	n, err := b.CheckNow(ctx)
	fmt.Println("checks:", n, err)
	fmt.Println("pending:", len(b.Pending()), "visible:", len(b.Messages("payments")))
	// Output:
	// pending: 1
	// checks: 1 <nil>
	// pending: 0 visible: 1
}

// exampleListener leaves the local transaction unknown when it runs and
// commits it when the broker checks.
type exampleListener struct{}

func (exampleListener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	return primitive.UnkonwnState
}

func (exampleListener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	return primitive.CommitMessageState
}
