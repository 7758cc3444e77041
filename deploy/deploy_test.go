package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/rmqtx/rmqtx/metrics"
)

var (
	rulesFile     = filepath.Join("prometheus", "rules.yaml")
	rulesTestFile = filepath.Join("prometheus", "rules_test.yaml")
	dashboardFile = filepath.Join("grafana", "rmqtx.json")
	metricsDoc    = filepath.Join("..", "METRICS.md")
)

// promtool finds the promtool binary. A missing promtool fails the test: the
// rules would otherwise ship unchecked.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RMQTX_PROMTOOL"); p != "" {
		return p
	}
	if testing.Short() {
		// make test-short needs nothing but Go; make test runs promtool.
		t.Skip("needs promtool (an external program); skipped in -short mode, run by make test")
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found on PATH: run `bash scripts/promtool.sh` (installs Debian's package prometheus) "+
			"or set RMQTX_PROMTOOL; the alert rules cannot be checked without it (%v)", err)
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	out := runPromtool(t, "prometheus", "check", "rules", "rules.yaml")
	require.Contains(t, out, "SUCCESS")
}

// TestPromtoolTestRules runs the alert unit tests: the alerts fire on the
// series the code emits, after their `for:`, with their runbook annotation.
func TestPromtoolTestRules(t *testing.T) {
	out := runPromtool(t, "prometheus", "test", "rules", "rules_test.yaml")
	require.Contains(t, out, "SUCCESS")
}

// TestDashboardQueriesParse checks every dashboard query with promtool, as
// recording rules, after replacing Grafana's variables.
func TestDashboardQueriesParse(t *testing.T) {
	d := loadDashboard(t)
	vars := regexp.MustCompile(`\$\{?([A-Za-z_]+)\}?`)
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, e := range d.exprs {
		e = vars.ReplaceAllStringFunc(e, func(v string) string {
			if strings.Contains(v, "__rate_interval") {
				return "5m"
			}
			return ".*"
		})
		rules = append(rules, rule{Record: fmt.Sprintf("rmqtx_dashboard:query%d", i), Expr: e})
	}
	require.NotEmpty(t, rules)
	doc := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	b, err := yaml.Marshal(doc)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dashboard.yaml"), b, 0o600))
	out := runPromtool(t, dir, "check", "rules", "dashboard.yaml")
	require.Contains(t, out, fmt.Sprintf("SUCCESS: %d rules found", len(rules)))
}

// TestRegistryDocumented: every collector of the metrics package is in
// METRICS.md's table with its type and labels, and the table lists nothing
// the registry lacks.
func TestRegistryDocumented(t *testing.T) {
	reg := registry(t)
	doc := loadMetricsDoc(t)
	for name, m := range reg {
		row, ok := doc[name]
		if !assertf(t, ok, "metric %s is registered but missing from METRICS.md", name) {
			continue
		}
		assertf(t, row.typ == m.typ, "METRICS.md: %s is a %s, the registry says %s", name, row.typ, m.typ)
		assertf(t, reflect.DeepEqual(row.labels, m.labels), "METRICS.md: %s labels %v, the registry says %v", name, row.labels, m.labels)
	}
	for name := range doc {
		_, ok := reg[name]
		assertf(t, ok, "METRICS.md documents %s, which the metrics package does not register", name)
	}
}

// TestLintEveryCollector runs client_golang's metric lint on every collector,
// each with one child so that vectors are linted too.
func TestLintEveryCollector(t *testing.T) {
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	cs := collectorsOf(t, m)
	require.Len(t, cs, reflect.TypeOf(metrics.Metrics{}).NumField())
	for field, c := range cs {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err, field)
		require.Empty(t, problems, "metrics.Metrics.%s", field)
		require.Equal(t, 1, testutil.CollectAndCount(c), "metrics.Metrics.%s collects one series", field)
	}
}

// TestRulesAndDashboardUseRegisteredMetrics: every metric and label the alert
// rules, their unit tests and the dashboard name exists, every `result` or
// `decision` value they match is documented for that metric, and every
// registered metric has at least one alert and one dashboard query.
func TestRulesAndDashboardUseRegisteredMetrics(t *testing.T) {
	reg := registry(t)
	doc := loadMetricsDoc(t)
	series := map[string]registered{} // series name (name, name_bucket, ...) -> family
	for _, m := range reg {
		for _, s := range m.series() {
			series[s] = m
		}
	}
	rules := loadRules(t)
	var alertExprs []string
	for _, r := range rules {
		alertExprs = append(alertExprs, r.Expr)
	}
	var testSeries []string
	for _, tc := range loadRuleTests(t).Tests {
		for _, s := range tc.InputSeries {
			testSeries = append(testSeries, s.Series)
		}
	}
	d := loadDashboard(t)

	check := func(where string, exprs []string) map[string]bool {
		used := map[string]bool{}
		for _, e := range exprs {
			for _, name := range metricToken.FindAllString(e, -1) {
				m, ok := series[name]
				if !assertf(t, ok, "%s: %q names %s, which is not a series of any registered metric", where, e, name) {
					continue
				}
				used[m.name] = true
			}
			for _, sel := range selector.FindAllStringSubmatch(e, -1) {
				m, ok := series[sel[1]]
				if !ok {
					continue
				}
				labels := m.labels
				if sel[1] == m.name+"_bucket" {
					labels = append(append([]string{}, labels...), "le")
				}
				for _, mt := range matcher.FindAllStringSubmatch(sel[2], -1) {
					label, op, value := mt[1], mt[2], mt[3]
					if label == "instance" || label == "job" {
						continue // added by the scrape
					}
					if !assertf(t, contains(labels, label), "%s: %q matches label %s, which %s does not have (%v)", where, e, label, m.name, labels) {
						continue
					}
					if (label != "result" && label != "decision") || (op != "=" && op != "=~") {
						continue
					}
					for _, v := range strings.Split(value, "|") {
						assertf(t, contains(doc[m.name].values, v), "%s: %q matches %s=%q, which METRICS.md does not document for %s", where, e, label, v, m.name)
					}
				}
			}
		}
		return used
	}
	inAlerts := check(rulesFile, alertExprs)
	check(rulesTestFile, testSeries)
	inDashboard := check(dashboardFile, append(append([]string{}, d.exprs...), d.templates...))
	for name := range reg {
		assertf(t, inAlerts[name], "%s: no alert uses %s", rulesFile, name)
		assertf(t, inDashboard[name], "%s: no panel uses %s", dashboardFile, name)
	}

	// label_values(<metric selector>, <label>) in the dashboard's variables.
	lv := regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_]\w*)\)$`)
	for _, q := range d.templates {
		mt := lv.FindStringSubmatch(q)
		if !assertf(t, mt != nil, "%s: variable query %q is not label_values(metric, label)", dashboardFile, q) {
			continue
		}
		for _, name := range metricToken.FindAllString(mt[1], -1) {
			if m, ok := series[name]; ok {
				assertf(t, contains(m.labels, mt[2]), "%s: variable %q reads label %s, which %s does not have", dashboardFile, q, mt[2], name)
			}
		}
	}
}

// TestAlertsNameRunbookCommands: every alert has a severity, a summary and a
// runbook annotation naming rmqtx commands; each command and each flag it
// uses is accepted by the CLI built from cmd/rmqtx.
func TestAlertsNameRunbookCommands(t *testing.T) {
	rules := loadRules(t)
	cli := buildCLI(t)
	usage := runCLI(t, cli)
	commands := map[string]bool{}
	inCommands := false
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.HasPrefix(line, "commands:"):
			inCommands = true
		case inCommands && strings.HasPrefix(line, "  "):
			f := strings.Fields(line)
			commands[f[0]] = true
			if len(f) > 1 && !strings.HasPrefix(f[1], "<") && !strings.HasPrefix(f[1], "[") && !strings.HasPrefix(f[1], "-") {
				commands[f[0]+" "+f[1]] = true
			}
		case inCommands && line == "":
			inCommands = false
		}
	}
	require.True(t, commands["stuck"] && commands["dead list"] && commands["inspect"], "usage of rmqtx lists its commands:\n%s", usage)

	helps := map[string]string{}
	names := map[string]bool{}
	for _, r := range rules {
		if !assertf(t, r.Alert != "", "%s: a recording rule (%s); only alerts are expected", rulesFile, r.Record) {
			continue
		}
		assertf(t, !names[r.Alert], "%s: alert %s defined twice", rulesFile, r.Alert)
		names[r.Alert] = true
		assertf(t, r.Labels["severity"] == "page" || r.Labels["severity"] == "ticket", "%s: alert %s: severity %q, want page or ticket", rulesFile, r.Alert, r.Labels["severity"])
		assertf(t, r.Annotations["summary"] != "", "%s: alert %s has no summary", rulesFile, r.Alert)
		rb := r.Annotations["runbook"]
		cmds := runbookCommands(rb)
		if !assertf(t, len(cmds) > 0, "%s: alert %s: runbook annotation %q names no rmqtx command", rulesFile, r.Alert, rb) {
			continue
		}
		for _, c := range cmds {
			if !assertf(t, commands[c.name], "%s: alert %s: runbook names `rmqtx %s`, which is not an rmqtx command", rulesFile, r.Alert, c.name) {
				continue
			}
			help, ok := helps[c.name]
			if !ok {
				help = runCLI(t, cli, append(strings.Fields(c.name), "-h")...)
				helps[c.name] = help
			}
			for _, f := range c.flags {
				assertf(t, strings.Contains(help, "\n  -"+f+" ") || strings.Contains(help, "\n  -"+f+"\n"),
					"%s: alert %s: `rmqtx %s` has no flag --%s", rulesFile, r.Alert, c.name, f)
			}
		}
	}
}

type runbookCommand struct {
	name  string // "stuck", "dead list"
	flags []string
}

// runbookCommands reads "rmqtx dead list --group x (comment); rmqtx stats" into
// its commands and flags.
func runbookCommands(s string) []runbookCommand {
	var out []runbookCommand
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		if i := strings.Index(part, "("); i >= 0 {
			part = part[:i]
		}
		f := strings.Fields(part)
		if len(f) < 2 || f[0] != "rmqtx" {
			continue
		}
		c := runbookCommand{name: f[1]}
		rest := f[2:]
		if c.name == "dead" && len(rest) > 0 {
			c.name += " " + rest[0]
			rest = rest[1:]
		}
		for _, a := range rest {
			if strings.HasPrefix(a, "-") {
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				c.flags = append(c.flags, name)
			}
		}
		out = append(out, c)
	}
	return out
}

func buildCLI(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds cmd/rmqtx")
	bin := filepath.Join(t.TempDir(), "rmqtx")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/rmqtx")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/rmqtx:\n%s", out)
	return bin
}

// runCLI returns what the CLI prints; usage and -h exit 0 or 2.
func runCLI(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no RMQTX_* settings from the caller
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 2) {
		t.Fatalf("rmqtx %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// ---------- the registry ----------

type registered struct {
	name   string
	typ    string // counter, gauge, histogram, summary
	labels []string
}

func (m registered) series() []string {
	switch m.typ {
	case "histogram":
		return []string{m.name + "_bucket", m.name + "_sum", m.name + "_count"}
	case "summary":
		return []string{m.name, m.name + "_sum", m.name + "_count"}
	}
	return []string{m.name}
}

// collectorsOf returns every field of m (each a collector), with one child
// created in each vector so that collecting yields a series.
func collectorsOf(t *testing.T, m *metrics.Metrics) map[string]prometheus.Collector {
	t.Helper()
	out := map[string]prometheus.Collector{}
	v := reflect.ValueOf(m).Elem()
	for i := 0; i < v.NumField(); i++ {
		field := v.Type().Field(i).Name
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		require.True(t, ok, "metrics.Metrics.%s is not a prometheus.Collector", field)
		out[field] = c
		get := v.Field(i).MethodByName("GetMetricWithLabelValues")
		if !get.IsValid() {
			continue // not a vector
		}
		made := false
		for n := 1; n <= 8 && !made; n++ {
			args := make([]reflect.Value, n)
			for j := range args {
				args[j] = reflect.ValueOf("x")
			}
			made = get.Call(args)[1].IsNil()
		}
		require.True(t, made, "metrics.Metrics.%s: no child with up to 8 labels", field)
	}
	return out
}

// registry returns the metric families metrics.New registers, by name.
func registry(t *testing.T) map[string]registered {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	cs := collectorsOf(t, m)
	fams, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, fams, len(cs), "every field of metrics.Metrics is registered by metrics.New")
	out := map[string]registered{}
	for _, f := range fams {
		r := registered{name: f.GetName(), typ: strings.ToLower(f.GetType().String())}
		if f.GetType() == dto.MetricType_UNTYPED {
			r.typ = "untyped"
		}
		for _, l := range f.GetMetric()[0].GetLabel() {
			r.labels = append(r.labels, l.GetName())
		}
		sort.Strings(r.labels)
		out[r.name] = r
	}
	return out
}

// ---------- METRICS.md ----------

type docRow struct {
	typ    string
	labels []string
	values []string // `backticked` words of the row: documented label values
}

var backticked = regexp.MustCompile("`([^`]+)`")

func loadMetricsDoc(t *testing.T) map[string]docRow {
	t.Helper()
	b, err := os.ReadFile(metricsDoc)
	require.NoError(t, err)
	out := map[string]docRow{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "| `rmqtx_") {
			continue
		}
		cells := strings.Split(line, "|")
		require.GreaterOrEqual(t, len(cells), 6, "METRICS.md row: %s", line)
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		row := docRow{typ: strings.TrimSpace(cells[2])}
		if l := strings.TrimSpace(cells[3]); l != "-" && l != "" {
			for _, s := range strings.Split(l, ",") {
				row.labels = append(row.labels, strings.TrimSpace(s))
			}
			sort.Strings(row.labels)
		}
		for _, m := range backticked.FindAllStringSubmatch(strings.Join(cells[4:], "|"), -1) {
			row.values = append(row.values, m[1])
		}
		_, dup := out[name]
		require.False(t, dup, "METRICS.md lists %s twice", name)
		out[name] = row
	}
	require.NotEmpty(t, out, "METRICS.md has a metrics table")
	return out
}

// ---------- the files ----------

var (
	metricToken = regexp.MustCompile(`\brmqtx_[A-Za-z0-9_]+`)
	selector    = regexp.MustCompile(`\b(rmqtx_[A-Za-z0-9_]+)\s*\{([^}]*)\}`)
	matcher     = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &f))
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out)
	return out
}

type ruleTests struct {
	Tests []struct {
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
	} `yaml:"tests"`
}

func loadRuleTests(t *testing.T) ruleTests {
	t.Helper()
	var f ruleTests
	b, err := os.ReadFile(rulesTestFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &f))
	require.NotEmpty(t, f.Tests)
	return f
}

type dashboard struct {
	exprs     []string // panel queries (PromQL with Grafana variables)
	templates []string // variable queries (label_values(...))
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	require.NotEmpty(t, d.UID)
	require.NotEmpty(t, d.Title)
	var out dashboard
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			require.False(t, ids[p.ID], "%s: panel id %d used twice", dashboardFile, p.ID)
			ids[p.ID] = true
			switch p.Type {
			case "row":
				walk(p.Panels)
				continue
			case "text":
				continue
			}
			require.NotEmpty(t, p.Targets, "%s: panel %q has no query", dashboardFile, p.Title)
			require.NotEmpty(t, p.Description, "%s: panel %q has no description", dashboardFile, p.Title)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "%s: panel %q: a query without expr", dashboardFile, p.Title)
				out.exprs = append(out.exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			require.NoError(t, json.Unmarshal(v.Query, &q.Query), "%s: variable %s", dashboardFile, v.Name)
		}
		out.templates = append(out.templates, q.Query)
	}
	return out
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Panels      []panel
	Targets     []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// ---------- helpers ----------

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// assertf reports a failure without stopping the test, so that one run lists
// every mismatch.
func assertf(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}
