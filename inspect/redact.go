package inspect

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Redactor turns a payload into what a human may see. It is applied to every
// payload the inspector returns (I10); the raw bytes never leave the package.
type Redactor func(payload []byte) string

// DefaultPrefixLen is a reasonable n for ShowPrefix when an operator opts in
// to seeing payload prefixes. The default redactor (Hidden) shows none.
const DefaultPrefixLen = 8

// ShowPrefix shows at most n leading bytes of a printable UTF-8 payload and
// masks the rest: `{"order_…` plus the total size. A binary payload shows only
// its size. n <= 0 shows nothing but the size.
func ShowPrefix(n int) Redactor {
	return func(p []byte) string {
		if p == nil {
			return ""
		}
		if n <= 0 || !utf8.Valid(p) || strings.ContainsFunc(string(p), func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' }) {
			return fmt.Sprintf("<%d bytes>", len(p))
		}
		if len(p) <= n {
			return fmt.Sprintf("%s… <%d bytes>", maskAll(string(p)), len(p))
		}
		cut := n
		for cut > 0 && !utf8.RuneStart(p[cut]) {
			cut--
		}
		s := strings.NewReplacer("\n", " ", "\t", " ").Replace(string(p[:cut]))
		return fmt.Sprintf("%s… <%d bytes>", s, len(p))
	}
}

// maskAll hides a payload short enough to be shown whole: a short payload is
// all secret, so only its shape remains.
func maskAll(s string) string {
	return strings.Repeat("*", utf8.RuneCountInString(s))
}

// Hidden shows only a payload's size: the default.
func Hidden() Redactor { return ShowPrefix(0) }

// Clear shows payloads as they are. Risky: card numbers, addresses and the
// like reach the screen and whatever records it. For local debugging only.
func Clear() Redactor {
	return func(p []byte) string { return string(p) }
}
