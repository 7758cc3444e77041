// Package sqlname validates the identifiers rmqtx puts into SQL text. Values
// are always bound; table names cannot be, so a configurable table prefix is
// checked against a strict pattern before it is ever concatenated.
package sqlname

import (
	"fmt"
	"regexp"
)

// MaxPrefixLen keeps prefixed names within MySQL's 64-character limit.
const MaxPrefixLen = 24

var prefixRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*$`)

// ValidatePrefix accepts an empty prefix or letters, digits and underscores
// starting with a letter, at most MaxPrefixLen long. An empty prefix is
// never used as it is: callers resolve it to DefaultPrefix first (Prefix).
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxPrefixLen || !prefixRE.MatchString(prefix) {
		return fmt.Errorf("sqlname: invalid table prefix %q: want [A-Za-z][A-Za-z0-9_]{0,%d}", prefix, MaxPrefixLen-1)
	}
	return nil
}

// Table returns prefix+name after validating the prefix.
func Table(prefix, name string) (string, error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", err
	}
	return prefix + name, nil
}
