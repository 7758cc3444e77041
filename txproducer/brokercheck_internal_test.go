package txproducer

import (
	"errors"
	"testing"
	"time"

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
