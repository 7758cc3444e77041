// Package deploy holds the operator files rmqtx ships next to the library:
// Prometheus alerting rules (prometheus/rules.yaml, with promtool unit tests
// in prometheus/rules_test.yaml) and a Grafana dashboard (grafana/rmqtx.json)
// for the metrics of package metrics (METRICS.md).
//
// The package has no code; its tests keep the files true to the code, so an
// alert cannot silently stop firing after a metric or a command is renamed:
//   - promtool check rules and promtool test rules pass (promtool comes from
//     Debian's package prometheus; scripts/promtool.sh installs it, and the
//     tests fail, never skip, without it);
//   - every metric, label and documented label value the rules and the
//     dashboard use exists in the metrics package's registry and METRICS.md;
//   - every registered metric is documented in METRICS.md with its type and
//     labels, has at least one alert and one dashboard panel, and passes
//     client_golang's testutil lint;
//   - every alert's runbook annotation names rmqtx commands and flags that
//     the built cmd/rmqtx accepts.
package deploy
