package txproducer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
)

// FenceAge + interval < timeout + (max-1) x interval, from checkback's doc.
func TestFenceAgeAgainstBrokerSettings(t *testing.T) {
	t.Parallel()
	conf := func(timeout, interval, checkMax string) map[string]string {
		return map[string]string{"transactionTimeOut": timeout, "transactionCheckInterval": interval, "transactionCheckMax": checkMax}
	}
	testBed := conf("3000", "2000", "5")    // bound: 3 + 4x2 - 2 = 9 s
	defaults := conf("6000", "30000", "15") // 5.x defaults: 6 + 14x30 - 30 = 396 s
	for _, tc := range []struct {
		name     string
		fenceAge time.Duration
		conf     map[string]string
		fits     bool
	}{
		{"test bed, tests' 4 s", 4 * time.Second, testBed, true},
		{"test bed, just below", 9*time.Second - time.Millisecond, testBed, true},
		{"test bed, at the bound", 9 * time.Second, testBed, false},
		{"test bed, default 60 s", DefaultFenceAge, testBed, false},
		{"broker defaults, default 60 s", DefaultFenceAge, defaults, true},
		{"broker defaults, 7 min", 7 * time.Minute, defaults, false},
		{"one check only", time.Second, conf("6000", "30000", "1"), false},
	} {
		e, err := fenceAgeAgainst("b:10911", tc.fenceAge, tc.conf)
		require.NoError(t, err, tc.name)
		if tc.fits {
			require.Nil(t, e, tc.name)
			continue
		}
		require.NotNil(t, e, tc.name)
		require.True(t, errors.Is(e, ErrConfig), tc.name)
		require.Contains(t, e.Error(), "FenceAge "+tc.fenceAge.String(), tc.name)
		require.Contains(t, e.Error(), "b:10911", tc.name)
	}
	e, err := fenceAgeAgainst("b:10911", DefaultFenceAge, testBed)
	require.NoError(t, err)
	require.Equal(t, 9*time.Second, e.MaxFenceAge())
	require.Equal(t, BrokerSettingsError{Broker: "b:10911", FenceAge: DefaultFenceAge, TransactionTimeOut: 3 * time.Second,
		CheckInterval: 2 * time.Second, CheckMax: 5}, *e)

	for _, bad := range []map[string]string{{}, conf("3000", "x", "5"), conf("3000", "2000", "-1")} {
		_, err := fenceAgeAgainst("b:10911", DefaultFenceAge, bad)
		require.Error(t, err, "%v", bad)
	}
}

// A broker that checks halves no later than it writes their op records
// (transactionTimeOut <= transactionOpBatchInterval, 3000 ms when the key is
// absent) gets one warning naming it and both numbers; one that writes them
// first, or whose settings cannot be read, gets none.
func TestOpBatchWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		conf           map[string]string
		warn           bool
		timeout, batch int64
	}{
		{"test bed", map[string]string{"transactionTimeOut": "3000", "transactionOpBatchInterval": "1000"}, false, 0, 0},
		{"broker defaults", map[string]string{"transactionTimeOut": "6000", "transactionOpBatchInterval": "3000"}, false, 0, 0},
		{"equal", map[string]string{"transactionTimeOut": "3000", "transactionOpBatchInterval": "3000"}, true, 3000, 3000},
		{"issue 27's run", map[string]string{"transactionTimeOut": "1000", "transactionOpBatchInterval": "3000"}, true, 1000, 3000},
		{"key absent: 3000", map[string]string{"transactionTimeOut": "2000"}, true, 2000, 3000},
		{"key absent, long timeout", map[string]string{"transactionTimeOut": "6000"}, false, 0, 0},
		{"no timeout", map[string]string{"transactionOpBatchInterval": "3000"}, false, 0, 0},
		{"bad interval", map[string]string{"transactionTimeOut": "1000", "transactionOpBatchInterval": "x"}, false, 0, 0},
	} {
		l, hook := test.NewNullLogger()
		warnOpBatch(l, "127.0.0.1:10911", tc.conf)
		if !tc.warn {
			require.Empty(t, hook.AllEntries(), tc.name)
			continue
		}
		require.Len(t, hook.AllEntries(), 1, tc.name)
		e := hook.LastEntry()
		require.Equal(t, logrus.WarnLevel, e.Level, tc.name)
		require.Equal(t, "127.0.0.1:10911", e.Data["broker"], tc.name)
		require.Equal(t, tc.timeout, e.Data["transactionTimeOut"], tc.name)
		require.Equal(t, tc.batch, e.Data["transactionOpBatchInterval"], tc.name)
		require.Contains(t, e.Message, "127.0.0.1:10911", tc.name)
		require.Contains(t, e.Message, fmt.Sprintf("transactionTimeOut %d ms <= transactionOpBatchInterval %d ms", tc.timeout, tc.batch), tc.name)
	}
}
