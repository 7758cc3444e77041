package sqlname

// DefaultPrefix is the table prefix of every rmqtx table unless configured
// (rmqtx_txlog, rmqtx_outbox, rmqtx_consume_log, ...). It is defined here
// once; the public packages re-export it (txlog.DefaultPrefix,
// consumer.DefaultTablePrefix, ...) so a service that mixes them cannot end
// up with two defaults.
const DefaultPrefix = "rmqtx_"

// OrDefault returns prefix, or DefaultPrefix when it is empty.
func OrDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}
