package sqlname

// DefaultPrefix is the table prefix of every rmqtx table unless configured
// (rmqtx_txlog, rmqtx_outbox, rmqtx_consume_log, ...). It is defined here
// once; the public packages re-export it under the same name
// (txlog.DefaultPrefix, consumer.DefaultPrefix, ...) so a service that mixes
// them cannot end up with two defaults. An empty prefix means it, in every
// package: rmqtx tables always carry a prefix.
const DefaultPrefix = "rmqtx_"

// OrDefault returns prefix, or DefaultPrefix when it is empty.
func OrDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

// Prefix returns the prefix a caller's setting names: prefix, or
// DefaultPrefix when it is empty, validated.
func Prefix(prefix string) (string, error) {
	prefix = OrDefault(prefix)
	if err := ValidatePrefix(prefix); err != nil {
		return "", err
	}
	return prefix, nil
}
