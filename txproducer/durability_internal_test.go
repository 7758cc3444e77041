package txproducer

import (
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
)

// A broker that acknowledges messages it has neither flushed nor copied to
// a synchronous slave (ASYNC_FLUSH on an ASYNC_MASTER, the RocketMQ
// defaults and the test bed's broker.conf) gets one warning naming it and
// both settings; SYNC_FLUSH, a SYNC_MASTER or a DLedger commit log gets
// none, and so does a configuration whose flushDiskType cannot be read.
func TestDurabilityWarning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		conf map[string]string
		warn bool
		role string // brokerRole the warning names
	}{
		{"test bed", map[string]string{"flushDiskType": "ASYNC_FLUSH", "brokerRole": "ASYNC_MASTER"}, true, "ASYNC_MASTER"},
		{"role absent: ASYNC_MASTER", map[string]string{"flushDiskType": "ASYNC_FLUSH"}, true, "ASYNC_MASTER"},
		{"dledger off", map[string]string{"flushDiskType": "ASYNC_FLUSH", "brokerRole": "ASYNC_MASTER", "enableDLegerCommitLog": "false"}, true, "ASYNC_MASTER"},
		{"sync flush", map[string]string{"flushDiskType": "SYNC_FLUSH", "brokerRole": "ASYNC_MASTER"}, false, ""},
		{"sync master", map[string]string{"flushDiskType": "ASYNC_FLUSH", "brokerRole": "SYNC_MASTER"}, false, ""},
		{"sync both", map[string]string{"flushDiskType": "SYNC_FLUSH", "brokerRole": "SYNC_MASTER"}, false, ""},
		{"dledger", map[string]string{"flushDiskType": "ASYNC_FLUSH", "brokerRole": "ASYNC_MASTER", "enableDLegerCommitLog": "true"}, false, ""},
		{"unreadable", map[string]string{}, false, ""},
		{"unknown value", map[string]string{"flushDiskType": "SOMETIMES", "brokerRole": "ASYNC_MASTER"}, false, ""},
	} {
		l, hook := test.NewNullLogger()
		warnDurability(l, "b:10911", tc.conf)
		if !tc.warn {
			require.Empty(t, hook.AllEntries(), tc.name)
			continue
		}
		require.Len(t, hook.AllEntries(), 1, tc.name)
		e := hook.LastEntry()
		require.Equal(t, logrus.WarnLevel, e.Level, tc.name)
		require.Equal(t, "b:10911", e.Data["broker"], tc.name)
		require.Equal(t, "ASYNC_FLUSH", e.Data["flushDiskType"], tc.name)
		require.Equal(t, tc.role, e.Data["brokerRole"], tc.name)
		require.Contains(t, e.Message, "broker b:10911: flushDiskType ASYNC_FLUSH and brokerRole "+tc.role, tc.name)
		require.Contains(t, e.Message, "SYNC_FLUSH", tc.name)
	}
}
