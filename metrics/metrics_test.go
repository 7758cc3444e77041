package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	Inc(m, func(m *Metrics) *prometheus.CounterVec { return m.OutboxSends }, "t", "e", "success", "")
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	require.NoError(t, err)
	Inc(m, func(m *Metrics) *prometheus.CounterVec { return m.CheckbackAnswers }, "g", "commit")
	require.Equal(t, 1.0, testutil.ToFloat64(m.CheckbackAnswers.WithLabelValues("g", "commit")))
	_, err = New(reg)
	require.Error(t, err)
}

func TestDiscardUndecidedGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	require.NoError(t, err)
	pick := func(m *Metrics) *prometheus.GaugeVec { return m.DiscardUndecided }
	Add(m, pick, 1, "g")
	Add(m, pick, 1, "g")
	Add(m, pick, -1, "g")
	require.Equal(t, 1.0, testutil.ToFloat64(m.DiscardUndecided.WithLabelValues("g")))
	Add(nil, pick, 1, "g") // nil-safe
	n, err := testutil.GatherAndCount(reg, "rmqtx_checkback_discard_undecided")
	require.NoError(t, err)
	require.Equal(t, 1, n, "registered with its HELP text")
}
