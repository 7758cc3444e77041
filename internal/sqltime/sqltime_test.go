package sqltime

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestScanForms(t *testing.T) {
	want := time.Date(2026, 12, 2, 13, 4, 5, 123456000, time.UTC)
	for name, v := range map[string]any{
		"time.Time": want.In(time.FixedZone("X", 3600)),
		"bytes":     []byte("2026-12-02 13:04:05.123456"),
		"string":    "2026-12-02 13:04:05.123456",
	} {
		var n NullTime
		require.NoError(t, n.Scan(v), name)
		require.True(t, n.Valid, name)
		require.True(t, want.Equal(n.Time), name)
		require.Equal(t, time.UTC, n.Time.Location(), name)
	}
	var n NullTime
	require.NoError(t, n.Scan([]byte("2026-12-02 13:04:05")))
	require.Equal(t, time.Date(2026, 12, 2, 13, 4, 5, 0, time.UTC), n.Time)
	require.NoError(t, n.Scan(nil))
	require.False(t, n.Valid)
	require.Nil(t, n.Ptr())
	require.Error(t, n.Scan(42))
	require.Error(t, n.Scan("yesterday"))

	var tm Time
	require.NoError(t, tm.Scan(nil))
	require.True(t, tm.IsZero())
}
