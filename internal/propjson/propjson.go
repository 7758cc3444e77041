// Package propjson writes message properties, a map[string]string, as the
// JSON object encoding/json.Marshal writes for the same map, byte for byte:
// keys sorted, HTML characters, U+2028, U+2029 and invalid UTF-8 escaped as
// encoding/json escapes them.
//
// It exists because txproducer stores every Send's properties as JSON in its
// txlog row, and json.Marshal's reflection, its map copy and its key sort
// through reflect values cost about 8 µs of CPU per Send in the bench's
// profiles, a third of the producer's own code (BENCHMARKS.md, "The producer:
// the overlap goroutine's stack, and the properties' JSON"). Readers keep
// using encoding/json: the output is the same bytes.
package propjson

import (
	"slices"
	"unicode/utf8"
)

// Encode returns the JSON object of props. A non-empty key adds the
// property key=value to the object, replacing props' own value of key, as
// if it had been set in a copy of props; props is not changed. A nil
// props with no key is "null", as json.Marshal writes a nil map.
func Encode(props map[string]string, key, value string) string {
	if props == nil && key == "" {
		return "null"
	}
	keys := make([]string, 0, len(props)+1)
	size := 2
	for k, v := range props {
		if key != "" && k == key {
			continue
		}
		keys = append(keys, k)
		size += len(k) + len(v) + 6
	}
	if key != "" {
		keys = append(keys, key)
		size += len(key) + len(value) + 6
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		if key != "" && k == key {
			b = appendString(b, value)
		} else {
			b = appendString(b, props[k])
		}
	}
	b = append(b, '}')
	return string(b)
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string the way encoding/json does with
// HTML escaping on (json.Marshal's default).
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if htmlSafe(b) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default: // other control bytes, and <, > and &
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 are valid in JSON but end a line in
		// JavaScript; encoding/json escapes them.
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// htmlSafe reports whether encoding/json writes the ASCII byte b as is
// with HTML escaping on: printable, and not ", \, <, > or &.
func htmlSafe(b byte) bool {
	return b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
}
