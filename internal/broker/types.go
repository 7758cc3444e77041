package broker

import (
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// The client's value types, named by the seam (see the package doc).
type (
	Message               = primitive.Message
	MessageExt            = primitive.MessageExt
	MessageQueue          = primitive.MessageQueue
	SendResult            = primitive.SendResult
	SendStatus            = primitive.SendStatus
	TransactionSendResult = primitive.TransactionSendResult
	LocalTransactionState = primitive.LocalTransactionState
	ConsumeResult         = consumer.ConsumeResult
	MessageSelector       = consumer.MessageSelector
	ConsumeFromWhere      = consumer.ConsumeFromWhere
)

// Local-transaction answers.
const (
	CommitMessageState   = primitive.CommitMessageState
	RollbackMessageState = primitive.RollbackMessageState
	UnknownState         = primitive.UnkonwnState // sic: the client's spelling
)

// Send statuses.
const (
	SendOK                = primitive.SendOK
	SendFlushDiskTimeout  = primitive.SendFlushDiskTimeout
	SendFlushSlaveTimeout = primitive.SendFlushSlaveTimeout
	SendSlaveNotAvailable = primitive.SendSlaveNotAvailable
)

// Consume results.
const (
	ConsumeSuccess    = consumer.ConsumeSuccess
	ConsumeRetryLater = consumer.ConsumeRetryLater
)

// Where a new consumer group starts.
const (
	ConsumeFromFirstOffset = consumer.ConsumeFromFirstOffset
	ConsumeFromLastOffset  = consumer.ConsumeFromLastOffset
)

// Message selector expressions.
const (
	SelectorTag   = consumer.TAG
	SelectorSQL92 = consumer.SQL92
)

// Message properties rmqtx reads or sets.
const (
	PropUniqKey              = primitive.PropertyUniqueClientMessageIdKeyIndex
	PropRealTopic            = primitive.PropertyRealTopic
	PropRealQueueID          = primitive.PropertyRealQueueId
	PropProducerGroup        = primitive.PropertyProducerGroup
	PropRetryTopic           = primitive.PropertyRetryTopic
	PropTransactionPrepared  = primitive.PropertyTransactionPrepared
	PropTransactionID        = primitive.PropertyTransactionID
	PropShardingKey          = primitive.PropertyShardingKey
	PropOriginMessageID      = primitive.PropertyOriginMessageId
	PropPreparedQueueOffset  = primitive.PropertyTranscationPreparedQueueOffset // sic
	PropCheckTimes           = primitive.PropertyTranscationCheckTimes          // sic
	PropCheckImmunitySeconds = primitive.PropertyCheckImmunityTimeInSeconds
	PropReconsumeTime        = primitive.PropertyReconsumeTime
	PropMaxReconsumeTimes    = primitive.PropertyMaxReconsumeTimes
	PropDelayTimeLevel       = primitive.PropertyDelayTimeLevel
	PropTimerDeliverMS       = primitive.PropertyTimerDeliverMS
	PropConsumeStartTime     = primitive.PropertyConsumeStartTime
	PropCluster              = primitive.PropertyCluster
	PropMsgRegion            = primitive.PropertyMsgRegion
	PropTraceSwitch          = primitive.PropertyTraceSwitch
	PropMinOffset            = primitive.PropertyMinOffset
	PropMaxOffset            = primitive.PropertyMaxOffset
)

// NewMessage returns a message for topic with body.
func NewMessage(topic string, body []byte) *Message { return primitive.NewMessage(topic, body) }

// NewUniqID returns a new client message id (UNIQ_KEY), as the client makes them.
func NewUniqID() string { return primitive.CreateUniqID() }

// END_TRANSACTION's commitOrRollback for COMMIT and ROLLBACK.
var (
	TransactionCommitType   = primitive.TransactionCommitType
	TransactionRollbackType = primitive.TransactionRollbackType
)
