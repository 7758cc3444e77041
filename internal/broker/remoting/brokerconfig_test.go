package remoting

import (
	"testing"
)

func TestParseProperties(t *testing.T) {
	got := ParseProperties([]byte("# comment\n\ntransactionTimeOut=3000\n transactionCheckMax = 5 \nbrokerIP1=127.0.0.1\nnoValue\n"))
	want := map[string]string{"transactionTimeOut": "3000", "transactionCheckMax": "5", "brokerIP1": "127.0.0.1"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: got %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
