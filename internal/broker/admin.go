package broker

import (
	"context"
	"fmt"

	"github.com/apache/rocketmq-client-go/v2/admin"
)

// CreateTopics creates (or updates) each of topics on the broker at
// brokerAddr with queues read and write queues, through the client's admin
// API (UPDATE_AND_CREATE_TOPIC, the client's defaults for everything else).
// It stops at the first topic that fails; the error names it.
func CreateTopics(ctx context.Context, nameServers []string, brokerAddr string, queues int, topics ...string) error {
	a, err := admin.NewAdmin(admin.WithResolver(NameServers(nameServers)))
	if err != nil {
		return fmt.Errorf("broker: admin: %w", err)
	}
	defer a.Close()
	for _, t := range topics {
		if err := a.CreateTopic(ctx, admin.WithTopicCreate(t), admin.WithBrokerAddrCreate(brokerAddr),
			admin.WithReadQueueNums(queues), admin.WithWriteQueueNums(queues)); err != nil {
			return fmt.Errorf("broker: create topic %s: %w", t, err)
		}
	}
	return nil
}
