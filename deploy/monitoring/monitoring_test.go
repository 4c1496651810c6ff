// Package monitoring checks the Grafana dashboard and the Prometheus alert
// rules of this directory against the service itself:
//
//   - promtool (the version .ci/tools.sh pins) accepts alerts.yaml and passes
//     its unit tests, alerts_test.yaml, in which every alert fires;
//   - every alert has a for, a severity, a summary, a description and a
//     runbook link to a section of docs/operations.md;
//   - every PromQL expression, of the alerts, of the dashboard's panels and of
//     its variables, parses, and selects only metrics the service exports: the
//     names its registry gathers, as internal/app builds it.
package monitoring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc"
	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/regions"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// Paths, relative to this package's directory, where `go test` runs.
const (
	alertsFile     = "alerts.yaml"
	alertTestsFile = "alerts_test.yaml"
	dashboardFile  = "dashboard.json"
	toolsScript    = "../../.ci/tools.sh"
	operationsDoc  = "../../docs/operations.md"
	runbookPrefix  = "https://github.com/slidingwindow/ratelimit/blob/main/docs/operations.md#"
)

func TestPromtoolChecksAndTestsTheRules(t *testing.T) {
	promtool := promtoolBinary(t)
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// promtoolBinary finds promtool on PATH and checks that it is the version
// .ci/tools.sh pins: the rules' unit tests are run by that version.
func promtoolBinary(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(toolsScript)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^PROMTOOL_VERSION=(\S+)`).FindSubmatch(script)
	if m == nil {
		t.Fatalf("%s has no PROMTOOL_VERSION= line", toolsScript)
	}
	pin := string(m[1])
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH: run `make tools` (.ci/tools.sh) to install promtool %s", pin)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: run `make tools` (.ci/tools.sh) to install promtool %s", bin, err, pin)
	}
	// "promtool, version 2.42.0+ds (branch: ...": Debian's +ds is its repack.
	v := regexp.MustCompile(`^promtool, version ([^ +]+)`).FindSubmatch(out)
	if v == nil || string(v[1]) != pin {
		t.Fatalf("%s reports %q, .ci/tools.sh pins %s: run `make tools` (.ci/tools.sh)", bin, firstLine(out), pin)
	}
	return bin
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(string(b), "\n")
	return line
}

// alertRule is an alert of alerts.yaml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadAlerts(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	decodeYAML(t, alertsFile, &file)
	var alerts []alertRule
	for _, g := range file.Groups {
		alerts = append(alerts, g.Rules...)
	}
	if len(alerts) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return alerts
}

// decodeYAML reads what the tests need of a file; promtool, which reads
// them strictly, refuses unknown keys.
func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestEveryAlertIsTestedAndDocumented holds each alert to what on-call
// needs: a severity, a summary and description, a runbook section that
// exists, and a unit test in which it fires.
func TestEveryAlertIsTestedAndDocumented(t *testing.T) {
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				AlertName string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	decodeYAML(t, alertTestsFile, &tests)
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.AlertName] = fires[a.AlertName] || len(a.ExpAlerts) > 0
		}
	}
	anchors := markdownAnchors(t, operationsDoc)
	for _, a := range loadAlerts(t) {
		t.Run(a.Alert, func(t *testing.T) {
			if a.Alert == "" {
				t.Fatalf("a rule that is not an alert: %+v", a)
			}
			if !fires[a.Alert] {
				t.Errorf("%s has no test in %s in which it fires", a.Alert, alertTestsFile)
			}
			if a.For == "" {
				t.Error("no for: say how long the condition must hold (0m: at once)")
			}
			if s := a.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("severity %q, want critical (pages) or warning", s)
			}
			for _, key := range []string{"summary", "description"} {
				if strings.TrimSpace(a.Annotations[key]) == "" {
					t.Errorf("no %s annotation", key)
				}
			}
			runbook := a.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(runbook, runbookPrefix)
			if !ok || !anchors[anchor] {
				t.Errorf("runbook_url %q is not %s followed by a heading's anchor of %s", runbook, runbookPrefix, operationsDoc)
			}
			if anchor != strings.ToLower(a.Alert) {
				t.Errorf("runbook anchor %q, want the alert's own section, #%s", anchor, strings.ToLower(a.Alert))
			}
		})
	}
}

// markdownAnchors returns the anchors GitHub gives the headings of a
// Markdown file, outside its code blocks: lower case, spaces as '-',
// punctuation dropped.
func markdownAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	inCode := false
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if heading, ok := strings.CutPrefix(line, "#"); ok && !inCode {
			heading = strings.TrimSpace(strings.TrimLeft(heading, "#"))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")] = true
		}
	}
	return anchors
}

// TestQueriesSelectExportedMetrics parses every expression of the alerts
// and of the dashboard (panels and variables), Grafana's variables
// substituted, and checks each metric it selects against the service's
// registry.
func TestQueriesSelectExportedMetrics(t *testing.T) {
	exported := exportedSeries(t)
	var queries []query
	for _, a := range loadAlerts(t) {
		queries = append(queries, query{where: "alert " + a.Alert, expr: a.Expr})
	}
	queries = append(queries, dashboardQueries(t)...)
	for _, q := range queries {
		if err := q.check(exported); err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d queries checked against %d exported series names", len(queries), len(exported))
}

// TestQueryCheckFails shows that the check of TestQueriesSelectExportedMetrics
// refuses what it must: a metric the service does not export, a histogram
// suffix of a metric that is no histogram, an expression that does not
// parse, a variable the dashboard does not define.
func TestQueryCheckFails(t *testing.T) {
	exported := exportedSeries(t)
	vars := map[string]string{"job": "sample", "__rate_interval": "5m"}
	for _, tc := range []struct {
		name, expr, wantErr string
		labelValues         bool
	}{
		{name: "exported", expr: `sum by (outcome) (rate(ratelimit_decisions_total{job=~"$job"}[$__rate_interval]))`},
		{name: "histogram buckets", expr: `histogram_quantile(0.99, sum by (le) (rate(ratelimit_store_call_duration_seconds_bucket[5m])))`},
		{name: "name as a matcher", expr: `{__name__="ratelimit_requests_shed_total"}`},
		{name: "variable query", expr: `ratelimit_config_info{job=~"$job"}`, labelValues: true},
		{name: "unknown metric", expr: `rate(ratelimit_decisions_totl[5m])`, wantErr: `"ratelimit_decisions_totl" is not exported`},
		{name: "unknown metric beside a known one", expr: `ratelimit_hot_keys / ratelimit_hot_key_count`, wantErr: `"ratelimit_hot_key_count" is not exported`},
		{name: "suffix of a counter", expr: `ratelimit_decisions_total_bucket`, wantErr: `"ratelimit_decisions_total_bucket" is not exported`},
		{name: "no metric name", expr: `{job="ratelimit"}`, wantErr: "selects no metric by name"},
		{name: "broken expression", expr: `sum by (outcome (rate(ratelimit_decisions_total[5m]))`, wantErr: "does not parse"},
		{name: "unknown function", expr: `rates(ratelimit_decisions_total[5m])`, wantErr: "does not parse"},
		{name: "undefined variable", expr: `ratelimit_decisions_total{domain=~"$domain"}`, wantErr: "undefined variable $domain"},
		{name: "unknown metric in a variable query", expr: `ratelimit_configs{job=~"$job"}`, labelValues: true, wantErr: `"ratelimit_configs" is not exported`},
		{name: "variable query of an expression", expr: `sum(ratelimit_config_info)`, labelValues: true, wantErr: "is no series selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := query{where: tc.name, expr: tc.expr, vars: vars, labelValues: tc.labelValues}
			err := q.check(exported)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tc.wantErr)
			}
		})
	}
}

// query is a PromQL expression of the dashboard or the alerts, with the
// values its Grafana variables take for the check.
type query struct {
	where, expr string
	vars        map[string]string
	// labelValues: a variable's query, the series selector of Grafana's
	// label_values(SELECTOR, LABEL), not an expression.
	labelValues bool
}

// grafanaVariable matches $name, ${name}, ${name:format} and [[name]].
var grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// check parses q, its variables substituted, and fails on a selector of a
// metric not in exported.
func (q query) check(exported map[string]bool) error {
	var undefined []string
	expr := grafanaVariable.ReplaceAllStringFunc(q.expr, func(ref string) string {
		m := grafanaVariable.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		v, ok := q.vars[name]
		if !ok {
			undefined = append(undefined, "$"+name)
		}
		return v
	})
	if len(undefined) > 0 {
		return fmt.Errorf("%s: undefined variable %s in %s", q.where, strings.Join(undefined, ", "), q.expr)
	}
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("%s: %q does not parse: %w", q.where, expr, err)
	}
	if _, isSelector := parsed.(*parser.VectorSelector); q.labelValues && !isSelector {
		return fmt.Errorf("%s: %q is no series selector", q.where, expr)
	}
	var errs []error
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			if name := metricName(vs); name == "" {
				errs = append(errs, fmt.Errorf("%s: %s selects no metric by name", q.where, vs))
			} else if !exported[name] {
				errs = append(errs, fmt.Errorf("%s: %q is not exported by the service (in %s)", q.where, name, q.expr))
			}
		}
		return nil
	})
	return errors.Join(errs...)
}

// metricName is the name a selector selects: as written, or by an equality
// matcher on __name__.
func metricName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// dashboardQueries returns the expressions of dashboard.json's panels (rows'
// nested panels too) and the selectors of its query variables, with the
// values its variables take for the check: a custom variable its current
// value, a query variable a regex-safe label value, Grafana's intervals 5m.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	dashboard := loadDashboard(t)
	vars := map[string]string{"__rate_interval": "5m", "__interval": "5m", "__range": "5m"}
	var queries []query
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range dashboard.Templating.List {
		switch v.Type {
		case "datasource":
			vars[v.Name] = "prometheus"
		case "custom", "constant":
			value, ok := v.Current.Value.(string)
			if !ok || value == "" {
				t.Fatalf("%s: variable %s has no current value", dashboardFile, v.Name)
			}
			vars[v.Name] = value
		case "query":
			vars[v.Name] = "sample"
			var q string
			switch query := v.Query.(type) {
			case string:
				q = query
			case map[string]any:
				q, _ = query["query"].(string)
			}
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				t.Fatalf("%s: variable %s: query %q is not label_values(SELECTOR, LABEL)", dashboardFile, v.Name, q)
			}
			queries = append(queries, query{where: "variable " + v.Name, expr: m[1], labelValues: true})
		default:
			t.Fatalf("%s: variable %s of type %q: give it a value for the check", dashboardFile, v.Name, v.Type)
		}
	}
	for _, p := range dashboard.allPanels() {
		for _, tg := range p.Targets {
			queries = append(queries, query{where: "panel " + p.Title, expr: tg.Expr})
		}
	}
	for i := range queries {
		queries[i].vars = vars
	}
	return queries
}

// dashboard is what the tests read of dashboard.json.
type dashboard struct {
	Templating struct {
		List []struct {
			Name    string `json:"name"`
			Type    string `json:"type"`
			Query   any    `json:"query"`
			Current struct {
				Value any `json:"value"`
			} `json:"current"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Title      string      `json:"title"`
	Type       string      `json:"type"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		Datasource *datasource `json:"datasource"`
		Expr       string      `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels returns the dashboard's panels, those of collapsed rows too.
func (d dashboard) allPanels() []panel {
	var all []panel
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return all
}

// TestDashboardQueriesTheDatasourceVariable: every panel and query reads
// the Prometheus data source chosen in the variable ${datasource}, so the
// dashboard imports into any Grafana without editing.
func TestDashboardQueriesTheDatasourceVariable(t *testing.T) {
	want := datasource{Type: "prometheus", UID: "${datasource}"}
	queries := 0
	for _, p := range loadDashboard(t).allPanels() {
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || *p.Datasource != want {
			t.Errorf("panel %q: datasource %+v, want %+v", p.Title, p.Datasource, want)
		}
		for _, tg := range p.Targets {
			queries++
			if tg.Datasource == nil || *tg.Datasource != want {
				t.Errorf("panel %q, query %s: datasource %+v, want %+v", p.Title, tg.Expr, tg.Datasource, want)
			}
		}
	}
	if queries == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
}

// exportedSeries returns the names of the series the service exports: the
// metrics of its registry, built as internal/app builds it (metrics.New, the
// Go and process collectors with them), a histogram's as its _bucket, _sum
// and _count. A metric with labels has no series before its first use, so
// every one is used once here; that none was missed is checked against
// what the registry describes.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	described := &describingRegisterer{Registerer: reg}
	m := metrics.New(described)

	m.Decision("domain", "rule", metrics.WithinLimit)
	m.StoreCall(time.Millisecond, "timeout")
	m.InvalidRequest("empty_domain")
	m.Shed()
	m.TransportRefused(transport.RefusedConnection)
	m.Overloaded()
	m.ConfigLoaded(1, "hash", "", "")
	m.ConfigReload("failure")
	m.RuleLimits([]metrics.RuleLimit{{Domain: "domain", Rule: "rule", Algorithm: "fixed", Window: time.Second, Requests: 1}})
	m.RLQSStream(1)
	m.RLQSReport("domain", "rule", 1, 1, "token_bucket")
	m.RLQSUnmatched()
	m.SliceObserver().Leased(1)
	m.RegionsObserver().Renewed(1, time.Millisecond)
	m.RegionsObserver().Keys(regions.KeyStates{Held: 1})
	m.Descriptor("domain.key", "domain.key")
	handler := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := m.UnaryServerInterceptor()(context.Background(), nil,
		&grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}, handler); err != nil {
		t.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	gathered := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		gathered[name] = true
		exported[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exported[name+suffix] = true
			}
		}
	}
	for _, name := range described.names(t) {
		if !gathered[name] {
			t.Errorf("%s is registered but has no series here: use it once in exportedSeries", name)
		}
	}
	return exported
}

// describingRegisterer keeps the descriptions of what is registered.
type describingRegisterer struct {
	prometheus.Registerer
	descs []*prometheus.Desc
}

func (r *describingRegisterer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		r.descs = append(r.descs, d)
	}
	return r.Registerer.Register(c)
}

func (r *describingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descName reads a Desc's name from its String, the only way it shows it.
var descName = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*")`)

func (r *describingRegisterer) names(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, d := range r.descs {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		name, err := strconv.Unquote(m[1])
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}
