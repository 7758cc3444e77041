package txproducer

import (
	"testing"
	"time"

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

// Replication settings under which a failover loses acknowledged messages
// get a warning naming the broker and the setting; a synchronous master
// whose slaveTimeout is not below SendTimeout gets one Info line; the HA
// test bed's settings (scripts/rocketmq/broker-ha.conf) and a plain
// ASYNC_MASTER get nothing.
func TestFailoverWarning(t *testing.T) {
	t.Parallel()
	const send = 3 * time.Second
	for _, tc := range []struct {
		name  string
		conf  map[string]string
		level logrus.Level // 0: nothing logged
		says  string
	}{
		{"ha bed", map[string]string{"enableControllerMode": "true", "allAckInSyncStateSet": "true", "enableElectUncleanMaster": "false", "slaveTimeout": "2000"}, 0, ""},
		{"async master", map[string]string{"brokerRole": "ASYNC_MASTER", "slaveTimeout": "3000"}, 0, ""},
		{"no all-ack", map[string]string{"enableControllerMode": "true", "allAckInSyncStateSet": "false", "slaveTimeout": "2000"}, logrus.WarnLevel, "allAckInSyncStateSet=false"},
		{"unclean", map[string]string{"enableControllerMode": "true", "allAckInSyncStateSet": "true", "enableElectUncleanMaster": "true", "slaveTimeout": "2000"}, logrus.WarnLevel, "enableElectUncleanMaster=true"},
		{"slave timeout default", map[string]string{"enableControllerMode": "true", "allAckInSyncStateSet": "true", "slaveTimeout": "3000"}, logrus.InfoLevel, "slaveTimeout 3000 ms is not below SendTimeout 3s"},
		{"sync master slave timeout", map[string]string{"brokerRole": "SYNC_MASTER", "slaveTimeout": "5000"}, logrus.InfoLevel, "slaveTimeout 5000 ms"},
		{"unreadable", map[string]string{}, 0, ""},
	} {
		l, hook := test.NewNullLogger()
		l.SetLevel(logrus.DebugLevel)
		warnFailover(l, "b:10911", tc.conf, send)
		if tc.level == 0 {
			require.Empty(t, hook.AllEntries(), tc.name)
			continue
		}
		require.Len(t, hook.AllEntries(), 1, tc.name)
		e := hook.LastEntry()
		require.Equal(t, tc.level, e.Level, tc.name)
		require.Contains(t, e.Message, "b:10911", tc.name)
		require.Contains(t, e.Message, tc.says, tc.name)
	}
}
