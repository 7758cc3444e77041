package wire_test

import (
	"bufio"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

// routingVectors reads the test vectors of WIRE.md's "Queue routing"
// section: table rows "| `key` | hash | queue of 4 | queue of 8 |".
func routingVectors(t *testing.T) [][4]string {
	t.Helper()
	f, err := os.Open("../WIRE.md")
	require.NoError(t, err)
	defer f.Close()
	var rows [][4]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "<!-- routing vectors begin"):
			in = true
		case strings.HasPrefix(line, "<!-- routing vectors end"):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(strings.Trim(line, "| "), "|")
			require.Len(t, cells, 4, line)
			var row [4]string
			for i, c := range cells {
				row[i] = strings.Trim(strings.TrimSpace(c), "`")
			}
			rows = append(rows, row)
		}
	}
	require.NoError(t, sc.Err())
	return rows
}

// The vectors WIRE.md publishes for other producers are what QueueFor
// computes, and KeyHash is the standard FNV-1a that rocketmq-client-go's
// hash selector uses.
func TestRoutingVectorsInWireMD(t *testing.T) {
	rows := routingVectors(t)
	require.GreaterOrEqual(t, len(rows), 5, "WIRE.md lists the routing vectors")
	for _, r := range rows {
		key := r[0]
		h, err := strconv.ParseUint(r[1], 10, 32)
		require.NoError(t, err, r)
		require.EqualValues(t, h, wire.KeyHash(key), "hash of %q", key)
		std := fnv.New32a()
		_, _ = std.Write([]byte(key))
		require.Equal(t, std.Sum32(), wire.KeyHash(key), "FNV-1a of %q", key)
		q4, _ := strconv.Atoi(r[2])
		q8, _ := strconv.Atoi(r[3])
		require.Equal(t, q4, wire.QueueFor(key, 4), "queue of 4 for %q", key)
		require.Equal(t, q8, wire.QueueFor(key, 8), "queue of 8 for %q", key)
	}
}

func TestRoutingKey(t *testing.T) {
	require.Equal(t, "Order/o-1", wire.RoutingKey("Order", "o-1", "biz"))
	require.Equal(t, "biz", wire.RoutingKey("", "", "biz"))
	require.Equal(t, "", wire.RoutingKey("", "", ""))
	e := wire.Envelope{AggregateType: "Order", AggregateID: "o-1", BusinessKey: "b"}
	require.Equal(t, "Order/o-1", e.RoutingKey())
	require.Equal(t, "Order/o-1", wire.PropertiesRoutingKey(e.Properties([]byte("x"))))
	require.Equal(t, -1, wire.QueueFor("", 4))
	require.Equal(t, -1, wire.QueueFor("k", 0))
	for n := 1; n < 40; n++ {
		q := wire.QueueFor("Order/o-1", n)
		require.True(t, q >= 0 && q < n)
	}
}
