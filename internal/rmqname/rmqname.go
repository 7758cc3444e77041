// Package rmqname validates the RocketMQ names rmqtx's components take in
// their Config or per message: topics, groups and name-server addresses.
// One rule for all, so a name one component accepts is never refused by
// another.
package rmqname

import (
	"fmt"
	"net"
	"regexp"
)

// nameRE is RocketMQ's rule for topic and group names (TopicValidator, 5.x).
var nameRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,127}$`)

// ValidTopic reports whether s is a valid topic (or group) name.
func ValidTopic(s string) bool { return nameRE.MatchString(s) }

// Topic returns an error naming what is wrong with topic, nil when valid.
func Topic(topic string) error {
	if !ValidTopic(topic) {
		return fmt.Errorf("%q: want [%%|a-zA-Z0-9_-]{1,127}", topic)
	}
	return nil
}

// Group is Topic for a consumer or producer group name.
func Group(group string) error { return Topic(group) }

// NameServers checks that addrs lists at least one name server and that
// each is host:port.
func NameServers(addrs []string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("is required")
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%q: want host:port", a)
		}
	}
	return nil
}
