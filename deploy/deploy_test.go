// Package deploy_test checks deploy/'s Grafana dashboard and Prometheus
// alert rules against what `hedgerow serve` exports (docs/architecture.md
// §9 "Dashboard and alerts"): a real Prometheus (Debian's package, `make
// prometheus`) scrapes two running serves, one on memory and one on Redis,
// under load; promtool checks and unit-tests the rules; every dashboard
// query must return series and every alert expression must evaluate.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/redistest"
	"github.com/hedgerow/hedgerow/internal/tools/loadgen"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The files under test, relative to this package.
const (
	dashboardFile  = "grafana/hedgerow.json"
	alertsFile     = "prometheus/alerts.yaml"
	alertsTestFile = "prometheus/alerts_test.yaml"
)

// Bounds of the test's waits; a healthy run takes a few seconds of each.
const (
	startWait = 30 * time.Second // a process to answer
	loadWait  = 30 * time.Second // the load to end and be scraped
	queryWait = 10 * time.Second // one HTTP call
)

// scrapeInterval is Prometheus' scrape and rule evaluation interval here:
// short, so a few seconds of load span several scrapes.
const scrapeInterval = 500 * time.Millisecond

// requestsPerServe is the load each serve takes: enough for the control
// arm (control_fraction 0.2) and some hedges.
const requestsPerServe = 120

// TestDashboardAndAlertsReadWhatServeExports: every metric the dashboard
// and the alert rules name is exported by serve from its start, with and
// without Redis (the regions' lease series by the serve of a region, on
// Redis, and by no serve of a deployment of one region); the rules pass promtool's check and unit tests; a real
// Prometheus scraping both serves under load loads and evaluates the rules,
// returns series for every query of every dashboard panel (Grafana's
// variables replaced by concrete values) and evaluates every alert
// expression.
func TestDashboardAndAlertsReadWhatServeExports(t *testing.T) {
	prometheusBin, promtoolBin := lookPrometheus(t)
	began := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	dash := readDashboard(t)
	alerts := readAlerts(t)
	names := metricNames(dash, alerts)
	if len(names) < 20 {
		t.Fatalf("only %d hedgerow_ metrics named by the dashboard and the rules: %v", len(names), names)
	}

	t.Run("promtool", func(t *testing.T) {
		promtool(t, promtoolBin, "check", "rules", alertsFile)
		promtool(t, promtoolBin, "test", "rules", alertsTestFile)
	})

	routes := []string{fakeRoute(t, 0), fakeRoute(t, 1)}
	serves := map[string]string{ // name → /metrics address
		"memory": startServe(t, routes, "", ""),
		"redis":  startServe(t, routes, redistest.Start(t).URL(), regionYAML),
	}
	for name, addr := range serves {
		// From the start: before any request and before any scrape. A
		// serve of a deployment of one region has no leases, so no lease
		// series; the serve of a region has them all.
		want, none := names, []string(nil)
		if name == "memory" {
			want = slices.DeleteFunc(slices.Clone(names), isLeaseMetric)
			none = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !isLeaseMetric(n) })
		}
		if missing := missingMetrics(t, addr, want); len(missing) > 0 {
			t.Errorf("serve on %s exports none of %v at start", name, missing)
		}
		if missing := missingMetrics(t, addr, none); len(missing) != len(none) {
			t.Errorf("serve on %s, of no region, exports lease series: of %v it lacks only %v", name, none, missing)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	phase("serves started, their metrics checked")
	prom := startPrometheus(t, prometheusBin, slices.Sorted(maps.Values(serves)))
	prom.waitScrapes(t, len(serves), 2)
	phase("prometheus scraping")

	var wg sync.WaitGroup
	answered := map[string]int{}
	var mu sync.Mutex
	for name, addr := range serves {
		wg.Go(func() {
			n := load(t, addr, name)
			mu.Lock()
			answered[addr] = n
			mu.Unlock()
		})
	}
	wg.Wait()
	phase("load sent")
	if t.Failed() {
		t.FailNow()
	}
	// Prometheus has scraped the end of the load when it counts every
	// answered group; then two more scrapes so every rate has its points.
	for addr, n := range answered {
		q := fmt.Sprintf(`sum(hedgerow_groups_total{instance=%q})`, addr)
		eventually.True(t, loadWait, fmt.Sprintf("Prometheus to count %d groups of %s", n, addr), func() bool {
			v, ok := prom.scalar(t, q)
			return ok && v >= float64(n)
		})
	}
	prom.waitScrapes(t, len(serves), prom.scrapes(t)+2)
	phase("the load scraped")

	// The load had both arms and hedges: otherwise the panels below would
	// read only the series created at start.
	var figures []string
	for _, q := range []string{
		`sum(hedgerow_tail_gain_samples{arm="control"})`,
		`sum(hedgerow_tail_gain_samples{arm="hedged"})`,
		`sum(hedgerow_hedges_launched_total)`,
		`sum(hedgerow_attempts_total{role="primary"})`,
	} {
		v, ok := prom.scalar(t, q)
		if !ok || v <= 0 {
			t.Errorf("after the load %s = %v, want > 0", q, v)
		}
		figures = append(figures, fmt.Sprintf("%s = %v", q, v))
	}
	cohort := prom.busiestCohort(t)
	t.Logf("answered %v; %d scrapes per serve; %s; $cohort = %s", answered, prom.scrapes(t), strings.Join(figures, ", "), cohort)

	t.Run("dashboard", func(t *testing.T) {
		vars := map[string]string{"cohort": regexp.QuoteMeta(cohort), "__rate_interval": "1m", "datasource": "prometheus"}
		for _, v := range dash.Templating.List {
			if _, ok := vars[v.Name]; !ok {
				t.Errorf("the dashboard's variable %s has no value in this test", v.Name)
			}
		}
		if vals := prom.labelValues(t, "cohort", "hedgerow_tail_gain_samples"); !slices.Contains(vals, cohort) {
			t.Errorf("the cohort variable's values %v lack %s", vals, cohort)
		}
		n := 0
		for _, p := range dash.panels() {
			for _, tg := range p.Targets {
				n++
				expr, err := substitute(tg.Expr, vars)
				if err != nil {
					t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
					continue
				}
				res, err := prom.query(t, expr)
				switch {
				case err != nil:
					t.Errorf("panel %q query %s: %v\n%s", p.Title, tg.RefID, err, expr)
				case len(res) == 0:
					t.Errorf("panel %q query %s returns no series\n%s", p.Title, tg.RefID, expr)
				}
			}
		}
		if n < 20 {
			t.Errorf("only %d dashboard queries", n)
		}
	})

	t.Run("autoscaler metrics", func(t *testing.T) {
		// The Prometheus adapter's rules deploy/k8s/README.md gives for
		// the HPAs, with the adapter's placeholders filled as it fills them
		// for one Pod: each returns a value per serve, the busy ratio
		// within [0, 1].
		for _, r := range adapterRules(t) {
			series, _, _ := strings.Cut(r.SeriesQuery, "{")
			expr := strings.NewReplacer("<<.Series>>", series, "<<.LabelMatchers>>", `job!=""`, "<<.GroupBy>>", "instance").Replace(r.MetricsQuery)
			res, err := prom.query(t, expr)
			switch {
			case err != nil:
				t.Errorf("rule %s: %v\n%s", r.Name.As, err, expr)
			case len(res) != len(serves):
				t.Errorf("rule %s returns %d series, want one per serve (%d)\n%s", r.Name.As, len(res), len(serves), expr)
			}
			for _, smp := range res {
				v, err := smp.value()
				if err != nil || v < 0 || (r.Name.As == "hedgerow_worker_busy_ratio" && v > 1) {
					t.Errorf("rule %s: %v (%v), want a number ≥ 0 (≤ 1 for a ratio)\n%s", r.Name.As, smp.Value, err, expr)
				}
			}
		}
	})

	t.Run("alerts", func(t *testing.T) {
		for _, r := range alerts {
			if _, err := prom.query(t, r.Expr); err != nil {
				t.Errorf("alert %s: %v\n%s", r.Alert, err, r.Expr)
			}
		}
		// Prometheus loaded the same file and evaluated each rule.
		var rules []promRule
		eventually.True(t, loadWait, "Prometheus to evaluate every alert rule", func() bool {
			rules = prom.rules(t)
			for _, r := range rules {
				if r.LastEvaluation.IsZero() || r.LastEvaluation.Year() < 2000 {
					return false
				}
			}
			return len(rules) == len(alerts)
		})
		for _, r := range rules {
			if r.Health != "ok" {
				t.Errorf("alert %s: health %s: %s", r.Name, r.Health, r.LastError)
			}
		}
	})
}

// lookPrometheus finds prometheus and promtool, failing (never skipping)
// with the way to install them.
func lookPrometheus(t *testing.T) (prometheus, promtool string) {
	t.Helper()
	var missing []string
	var paths []string
	for _, name := range []string{"prometheus", "promtool"} {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
		}
		paths = append(paths, p)
	}
	if len(missing) > 0 {
		t.Fatalf("%s not found on PATH: run `make prometheus` (Debian's prometheus package) to install them", strings.Join(missing, " and "))
	}
	return paths[0], paths[1]
}

// promtool runs promtool with args in this directory and fails with its
// output when it fails.
func promtool(t *testing.T, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), startWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int      `json:"id"`
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// panels are every panel, those inside collapsed rows too.
func (d dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	ids := map[int]string{}
	for _, p := range d.panels() {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("%s: panels %q and %q share id %d", dashboardFile, other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q query %s has no expression", dashboardFile, p.Title, tg.RefID)
			}
		}
	}
	return d
}

// alertRule is one rule of alerts.yaml.
type alertRule struct {
	Alert string `yaml:"alert"`
	Expr  string `yaml:"expr"`
}

func readAlerts(t *testing.T) []alertRule {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no rule", alertsFile)
	}
	return out
}

// metricName is a hedgerow metric as a query names it.
var metricName = regexp.MustCompile(`\bhedgerow_[a-z0-9_]+`)

// metricNames are the hedgerow metrics the dashboard and the rules name.
func metricNames(d dashboard, rules []alertRule) []string {
	set := map[string]bool{}
	for _, p := range d.panels() {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				set[n] = true
			}
		}
	}
	for _, r := range rules {
		for _, n := range metricName.FindAllString(r.Expr, -1) {
			set[n] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// missingMetrics are the names of which addr's /metrics holds no sample.
func missingMetrics(t *testing.T, addr string, names []string) []string {
	t.Helper()
	body := get(t, "http://"+addr+"/metrics")
	has := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		has[name] = true
	}
	var missing []string
	for _, n := range names {
		if !has[n] {
			missing = append(missing, n)
		}
	}
	return missing
}

// fakeRoute serves simulator route n of a fast gpt4o model (a model second
// lasting 20 real ms, short answers, no errors or hangs): its stalls are
// what the hedges rescue.
func fakeRoute(t *testing.T, n int) string {
	t.Helper()
	m, err := workload.ByName(workload.GPT4o)
	if err != nil {
		t.Fatal(err)
	}
	m.ErrorFraction, m.TTFT.HangFraction = 0, 0
	m.OutputTokens = workload.LogNormal{Mu: math.Log(8)}
	f, err := node.StartFakeLLM("127.0.0.1:0", fakellm.Options{Model: m, Seed: 11, TimeScale: 0.02, Route: n}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, f) })
	return "http://" + f.Addr().String() + "/v1"
}

// serveYAML is serve's configuration: two fake routes in pool general and a
// policy that hedges at a pinned 20 ms, a fifth of the groups in the
// control arm. The timeouts are generous: the test asserts what is
// exported, not latency, on a loaded machine under the race detector.
const serveYAML = `http:
  listen: 127.0.0.1:0
routes:
  - {name: fake-a, provider: openai, base_url: %q, model: gpt4o}
  - {name: fake-b, provider: openai, base_url: %q, model: gpt4o}
pools:
  general: {routes: [fake-a, fake-b]}
policies:
  default:
    hedge: true
    control_fraction: 0.2
    deadline: 10s
    min_useful_time: 10ms
    accept_timeout: 2s
    heartbeat_timeout: 3s
    delay: {min: 20ms, initial: 20ms, max: 20ms}
    duplicate_rate: {ceiling: 0.5}
`

// regionYAML makes a serve the gateway of region east of two (west never
// seen): its leases' gauges exist from its start for the one global kind,
// tenants' rates, which no tenant here has, so the load is as without it.
const regionYAML = `deployment: {region: east}
global: {regions: [east, west], ceilings: [tenant_rate]}
`

// isLeaseMetric reports whether name is one of a region's lease series,
// which only a deployment of regions exports (docs/architecture.md §14).
// isLeaseMetric says a metric is a region's: its leases' or its index of
// user actions across regions (docs/architecture.md §14), exported only by
// the serve of a deployment of regions.
func isLeaseMetric(name string) bool {
	return strings.HasPrefix(name, "hedgerow_lease_") || strings.HasPrefix(name, "hedgerow_cross_region_")
}

// startServe starts serve in this process on a free port, on Redis when
// redisURL is set, with extraYAML added to its configuration, and returns
// its HTTP address.
func startServe(t *testing.T, routes []string, redisURL, extraYAML string) string {
	t.Helper()
	y := fmt.Sprintf(serveYAML, routes[0], routes[1]) + extraYAML
	if redisURL != "" {
		t.Setenv("DEPLOY_TEST_HASH_KEY", "deploy-test-hash-key")
		y += fmt.Sprintf("redis: {url: %q, key_prefix: deploytest, hash_key_env: DEPLOY_TEST_HASH_KEY, timeout: 1s}\n", redisURL)
	}
	cfg, err := config.Parse("serve.yaml", []byte(y), config.RoleServe, os.LookupEnv)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	s, err := node.StartServe(cfg, node.Options{})
	if err != nil {
		t.Fatalf("StartServe: %v", err)
	}
	t.Cleanup(func() { stop(t, s) })
	return s.HTTPAddr().String()
}

func stop(t *testing.T, s interface{ Stop(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startWait)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// load sends requestsPerServe chat completions to addr, half of them
// streamed, at seeded Poisson arrivals, and returns how many were answered
// 200; it fails the test when none was.
func load(t *testing.T, addr, name string) int {
	reqs := make([]loadgen.Request, requestsPerServe)
	for i := range reqs {
		reqs[i] = loadgen.Request{Body: fmt.Appendf(nil,
			`{"model":"general","messages":[{"role":"user","content":"hello %d"}],"max_tokens":64,"stream":%t}`, i, i%2 == 0)}
	}
	client := loadgen.NewClient(32)
	defer client.CloseIdleConnections()
	sum, err := loadgen.Run(t.Context(), loadgen.Options{
		BaseURL: "http://" + addr, Requests: reqs, Rate: 50, Seed: 3, Timeout: loadWait, MaxInFlight: 32, Client: client,
	})
	if err != nil {
		t.Errorf("load on %s: %v", name, err)
		return 0
	}
	ok := 0
	var firstErr error
	for _, r := range sum.Results {
		if r.Status == http.StatusOK && r.Err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = fmt.Errorf("status %d: %v", r.Status, r.Err)
		}
	}
	// What is asserted is what Prometheus reads, not the answers: on a
	// loaded machine under the race detector Redis may miss its timeout
	// and fail some groups (gate_unavailable), which the dashboard shows.
	if ok == 0 {
		t.Errorf("load on %s: none of %d answered; first failure: %v", name, requestsPerServe, firstErr)
	} else if ok < requestsPerServe {
		t.Logf("load on %s: %d of %d answered; first failure: %v", name, ok, requestsPerServe, firstErr)
	}
	return ok
}

// prometheus is a running prometheus process.
type prometheus struct {
	base   string
	client *http.Client
}

// startPrometheus starts prometheus on a free port with a temporary store,
// scraping targets (host:port) every scrapeInterval as job hedgerow and
// evaluating alertsFile's rules as often; the test's cleanup kills it.
func startPrometheus(t *testing.T, bin string, targets []string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [%[2]q]
scrape_configs:
  - job_name: hedgerow
    static_configs:
      - targets: [%[3]s]
`, scrapeInterval, rules, strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // "signal: killed" at cleanup, or an early exit the log explains
		close(exited)
	}()
	p := &prometheus{base: "http://" + addr, client: &http.Client{Timeout: queryWait}}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		p.client.CloseIdleConnections()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("prometheus log:\n%s", data)
		}
	})
	eventually.True(t, startWait, "prometheus at "+addr+" to be ready", func() bool {
		select {
		case <-exited:
			data, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited at start:\n%s", data)
		default:
		}
		resp, err := p.client.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// scrapes is how many successful scrapes the target scraped least often
// has had: the samples of up == 1 over the last 10 minutes.
func (p *prometheus) scrapes(t *testing.T) int {
	t.Helper()
	v, ok := p.scalar(t, `min(sum_over_time(up{job="hedgerow"}[10m]))`)
	if !ok {
		return 0
	}
	return int(v)
}

// waitScrapes waits until each of n targets has been scraped successfully
// at least least times.
func (p *prometheus) waitScrapes(t *testing.T, n, least int) {
	t.Helper()
	eventually.True(t, loadWait, fmt.Sprintf("%d scrapes of each of %d serves", least, n), func() bool {
		res, err := p.query(t, `sum_over_time(up{job="hedgerow"}[10m])`)
		if err != nil || len(res) != n {
			return false
		}
		for _, s := range res {
			if v, err := s.value(); err != nil || v < float64(least) {
				return false
			}
		}
		return true
	})
}

// sample is one series of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) value() (float64, error) {
	str, ok := s.Value[1].(string)
	if !ok {
		return 0, fmt.Errorf("value %v is not a string", s.Value[1])
	}
	return strconv.ParseFloat(str, 64)
}

// query evaluates expr now; an error is Prometheus refusing it (a parse
// or evaluation error) or the API not answering.
func (p *prometheus) query(t *testing.T, expr string) ([]sample, error) {
	t.Helper()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.api(t, "/api/v1/query?query="+url.QueryEscape(expr), &out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", out.Error)
	}
	switch out.Data.ResultType {
	case "vector":
		var res []sample
		if err := json.Unmarshal(out.Data.Result, &res); err != nil {
			return nil, fmt.Errorf("prometheus: result: %w", err)
		}
		return res, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(out.Data.Result, &v); err != nil {
			return nil, fmt.Errorf("prometheus: result: %w", err)
		}
		return []sample{{Value: v}}, nil
	}
	return nil, fmt.Errorf("prometheus: result type %s", out.Data.ResultType)
}

// scalar is the value of a query that returns one series.
func (p *prometheus) scalar(t *testing.T, expr string) (float64, bool) {
	t.Helper()
	res, err := p.query(t, expr)
	if err != nil || len(res) != 1 {
		return 0, false
	}
	v, err := res[0].value()
	return v, err == nil
}

// busiestCohort is the cohort with the most control groups.
func (p *prometheus) busiestCohort(t *testing.T) string {
	t.Helper()
	res, err := p.query(t, `topk(1, sum by (cohort) (hedgerow_tail_gain_samples{arm="control"}))`)
	if err != nil || len(res) != 1 || res[0].Metric["cohort"] == "" {
		t.Fatalf("no cohort with control groups: %v %v", res, err)
	}
	return res[0].Metric["cohort"]
}

// labelValues is what the Grafana variable label_values(metric, label)
// offers.
func (p *prometheus) labelValues(t *testing.T, label, metric string) []string {
	t.Helper()
	var out struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	if err := p.api(t, "/api/v1/label/"+label+"/values?match[]="+url.QueryEscape(metric), &out); err != nil || out.Status != "success" {
		t.Errorf("label values of %s on %s: %v (%s)", label, metric, err, out.Status)
	}
	return out.Data
}

// promRule is an alerting rule as Prometheus' rules API shows it.
type promRule struct {
	Name           string    `json:"name"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

func (p *prometheus) rules(t *testing.T) []promRule {
	t.Helper()
	var out struct {
		Data struct {
			Groups []struct {
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := p.api(t, "/api/v1/rules?type=alert", &out); err != nil {
		return nil
	}
	var rules []promRule
	for _, g := range out.Data.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// api GETs path and decodes its JSON body into v. Prometheus answers a bad
// query 400 with the error in the body, which v then holds.
func (p *prometheus) api(t *testing.T, path string, v any) error {
	t.Helper()
	resp, err := p.client.Get(p.base + path)
	if err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("prometheus: %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	return nil
}

// grafanaVar is a Grafana variable in a query: $name, ${name} or
// ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|\$([A-Za-z0-9_]+)`)

// substitute replaces the Grafana variables of expr with vars' values; a
// variable vars does not know is an error.
func substitute(expr string, vars map[string]string) (string, error) {
	var unknown []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		v, ok := vars[name]
		if !ok {
			unknown = append(unknown, m)
			return m
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown Grafana variables %v", unknown)
	}
	return out, nil
}

func get(t *testing.T, u string) []byte {
	t.Helper()
	client := &http.Client{Timeout: queryWait}
	defer client.CloseIdleConnections()
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", u, resp.StatusCode, err)
	}
	return data
}

// freeAddr returns a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// adapterRule is one rule of prometheus-adapter's `rules:`.
type adapterRule struct {
	SeriesQuery string `yaml:"seriesQuery"`
	Resources   any    `yaml:"resources"`
	Name        struct {
		As string `yaml:"as"`
	} `yaml:"name"`
	MetricsQuery string `yaml:"metricsQuery"`
}

// adapterRules reads the adapter rules deploy/k8s/README.md gives for
// the HPAs' Pods metrics: its yaml block of rules.
func adapterRules(t *testing.T) []adapterRule {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("k8s", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```yaml\n- seriesQuery:")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("deploy/k8s/README.md holds no yaml block of adapter rules")
	}
	var rules []adapterRule
	dec := yaml.NewDecoder(strings.NewReader("- seriesQuery:" + block))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("deploy/k8s/README.md's adapter rules: %v", err)
	}
	if len(rules) != 2 {
		t.Fatalf("deploy/k8s/README.md gives %d adapter rules, want the HPAs' two", len(rules))
	}
	return rules
}
