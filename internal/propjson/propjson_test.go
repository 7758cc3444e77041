package propjson

import (
	"encoding/json"
	"maps"
	"testing"
)

// want is what json.Marshal writes for props with key=value set in a copy.
func want(t testing.TB, props map[string]string, key, value string) string {
	t.Helper()
	m := maps.Clone(props) // nil stays nil: "null"
	if key != "" {
		if m == nil {
			m = map[string]string{}
		}
		m[key] = value
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEncodeIsJSONMarshal(t *testing.T) {
	cases := []struct {
		name       string
		props      map[string]string
		key, value string
	}{
		{"nil", nil, "", ""},
		{"empty", map[string]string{}, "", ""},
		{"only the extra", nil, "UNIQ_KEY", "7F000001"},
		{"sorted", map[string]string{"b": "2", "a": "1", "C": "3", "aa": "0"}, "", ""},
		{"extra replaces", map[string]string{"UNIQ_KEY": "old", "x": "y"}, "UNIQ_KEY", "new"},
		{"escapes", map[string]string{"q\"k": "a\\b\"c", "ctl": "\b\f\n\r\t\x00\x1f\x7f"}, "", ""},
		{"html", map[string]string{"<k>": "a&b<c>d"}, "&", ">"},
		{"unicode", map[string]string{"ü": "日本\u2028x\u2029y", "emoji": "😀"}, "", ""},
		{"invalid utf-8", map[string]string{"\xff": "a\xc3(b\xed\xa0\x80"}, "", ""},
		{"empty strings", map[string]string{"": ""}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := maps.Clone(c.props)
			if got, w := Encode(c.props, c.key, c.value), want(t, c.props, c.key, c.value); got != w {
				t.Fatalf("Encode = %s, json.Marshal = %s", got, w)
			}
			if !maps.Equal(before, c.props) {
				t.Fatalf("props changed: %v, was %v", c.props, before)
			}
		})
	}
}

func FuzzEncodeIsJSONMarshal(f *testing.F) {
	f.Add("k", "v", "k2", "<&>\u2028\xff", "UNIQ_KEY", "x")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, key, value string) {
		props := map[string]string{k1: v1, k2: v2}
		if got, w := Encode(props, key, value), want(t, props, key, value); got != w {
			t.Fatalf("Encode = %q, json.Marshal = %q", got, w)
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	props := map[string]string{
		"rmqtx.event_id": "0193a4f2-7b1c-7d3e-9f00-123456789abc", "rmqtx.event_type": "payment.succeeded",
		"rmqtx.event_version": "1", "rmqtx.payload_sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"rmqtx.aggregate_type": "payment", "rmqtx.aggregate_id": "p-123", "KEYS": "p-123", "TAGS": "succeeded",
	}
	b.Run("Encode", func(b *testing.B) {
		for b.Loop() {
			_ = Encode(props, "UNIQ_KEY", "7F0000010001")
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			m := maps.Clone(props)
			m["UNIQ_KEY"] = "7F0000010001"
			_, _ = json.Marshal(m)
		}
	})
}
