package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSignatureRoundTrip(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret")
	body := []byte(`{"payment_id":"p1"}`)
	now := time.Unix(1_700_000_000, 0)
	h := Sign(secret, body, now)
	require.NoError(t, Verify(secret, h, body, now))
	require.NoError(t, Verify(secret, h, body, now.Add(MaxSignatureAge-time.Second)))

	require.ErrorIs(t, Verify([]byte("other"), h, body, now), errSignatureBad, "wrong secret")
	require.ErrorIs(t, Verify(secret, h, []byte(`{"payment_id":"p2"}`), now), errSignatureBad, "tampered body")
	require.ErrorIs(t, Verify(secret, h, body, now.Add(MaxSignatureAge+time.Second)), errSignatureOld, "replayed late")
	require.ErrorIs(t, Verify(secret, h, body, now.Add(-MaxSignatureAge-time.Second)), errSignatureOld, "from the future")
	for _, bad := range []string{"", "t=1", "v1=ab", "t=1,v1=zz", "garbage", "t=x,v1=" + h[len(h)-64:]} {
		require.Error(t, Verify(secret, bad, body, now), "header %q", bad)
	}
}

func TestEventIDIsDerivedAndStable(t *testing.T) {
	t.Parallel()
	a := paymentEventID("pay_1")
	require.Equal(t, a, paymentEventID("pay_1"), "same payment, same id: every retry sends it")
	require.Equal(t, a, EventID(TypePaymentSucceeded, "pay_1"))
	require.NotEqual(t, a, paymentEventID("pay_2"))
	require.NotEqual(t, EventID(TypeOrderCreated, "o1"), EventID(TypeOrderPaid, "o1"))
	require.LessOrEqual(t, len(a), 64)
}

func TestUserLimiter(t *testing.T) {
	t.Parallel()
	l := &UserLimiter{Every: time.Second, Burst: 2}
	now := time.Unix(1_700_000_000, 0)
	require.True(t, l.Allow(1, now))
	require.True(t, l.Allow(1, now))
	require.False(t, l.Allow(1, now), "third SMS within the burst window is throttled")
	require.True(t, l.Allow(2, now), "another user has its own bucket")
	require.True(t, l.Allow(1, now.Add(time.Second)), "a token comes back after Every")
	require.False(t, l.Allow(1, now.Add(time.Second)))
}

func TestPickShareAndInjectorOnce(t *testing.T) {
	t.Parallel()
	n := 0
	for i := range 10000 {
		if pick(fmt.Sprintf("k%d", i), 0.1) {
			n++
		}
	}
	require.InDelta(t, 1000, n, 150, "about 10%% picked")
	require.False(t, pick("anything", 0))

	in := &Injector{Rate: 1}
	require.Error(t, in.Fail("g", "e1"), "first attempt fails")
	require.NoError(t, in.Fail("g", "e1"), "the retry succeeds")
	require.Error(t, in.Fail("g2", "e1"), "per group")
	require.EqualValues(t, 2, in.Injected.Load())
}

func TestShuffleIsDeterministicPermutation(t *testing.T) {
	t.Parallel()
	mk := func() []plannedOrder {
		xs := make([]plannedOrder, 50)
		for i := range xs {
			xs[i].OrderID = fmt.Sprint(i)
		}
		return xs
	}
	a, b := mk(), mk()
	shuffle(a, "seed")
	shuffle(b, "seed")
	require.Equal(t, a, b)
	seen := map[string]bool{}
	for _, o := range a {
		seen[o.OrderID] = true
	}
	require.Len(t, seen, 50)
	require.NotEqual(t, mk(), a)
}

// Both schema files create the same 8 tables, and their indexes.
func TestSchemaStatementsSplit(t *testing.T) {
	t.Parallel()
	tables := func(schema string) []string {
		var names []string
		for _, s := range splitSchema(schema) {
			if strings.HasPrefix(s, "CREATE INDEX IF NOT EXISTS") {
				continue
			}
			require.True(t, strings.HasPrefix(s, "CREATE TABLE IF NOT EXISTS "), s)
			names = append(names, strings.Fields(s)[5])
		}
		return names
	}
	my := tables(schemaMySQL)
	require.Len(t, my, 8)
	require.Equal(t, my, tables(schemaPostgres))
	require.Len(t, splitSchema(schemaPostgres), 8+2, "8 tables and the 2 secondary indexes MySQL declares inline")
}

func TestParseEngine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": EngineMySQL, "mariadb": EngineMySQL, "MySQL": EngineMySQL, "postgres": EnginePostgres, "pg": EnginePostgres, "postgresql": EnginePostgres} {
		got, err := parseEngine(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := parseEngine("sqlite")
	require.Error(t, err)
}
