package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/node"
	"github.com/hedgerow/hedgerow/internal/redact"
	hreport "github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/tailplot"
)

// reportFlags are `hedgerow report`'s flags.
type reportFlags struct {
	url, apiKey, keyEnv                 string
	natsURLs                            []string
	natsSeed, natsInbox, stream, region string
	since                               time.Duration
	asJSON                              bool
	plotPath, exportPath                string
	opts                                hreport.Options
	timeout                             time.Duration
}

func newReportCmd() *cobra.Command {
	var fl reportFlags
	cmd := &cobra.Command{
		Use:   "report (--url URL | --nats URL,...) [--since D] [--json] [--plot FILE.png] [--export FILE.jsonl]",
		Short: "Report hedging's figures from the kept records, per cohort and in total",
		Long: `report reads the kept records (docs/architecture.md §9) and prints, per cohort and in total:
groups and control groups, hedged and control P50/P99/P99.9 with the tail gain (control P99 ÷
hedged P99) and its seeded bootstrap interval (withheld below a sample floor per arm), the
duplicate rate, usage of winners and losers, the extra cost ratio, late completions, the share of
cancellations observed, suppressions by reason and guardrail decisions. When the records hold
more than one region (a record's region is its gateway's deployment.region), each region's
figures come first, then those over all regions.

It reads the records stream directly (--nats, with the observer role's nkey seed and inbox prefix
when NATS has authentication), or asks a gateway (--url; the tenant of the API key must have
reports: true — the key from --api-key or the variable --api-key-env names). --since 10m keeps
the groups of the last ten minutes; --export FILE.jsonl writes the records read, in the shape
` + "`hedgerow simulate --records`" + ` reads; --plot FILE.png draws the arms' latency tails on log scales.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (fl.url == "") == (len(fl.natsURLs) == 0) {
				return errors.New("report: give exactly one of --url and --nats")
			}
			if fl.since < 0 {
				return errors.New("report: --since must not be negative")
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, fl.timeout)
			defer cancel()
			return fl.run(ctx, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.url, "url", "", "root of a gateway's HTTP front door, e.g. http://127.0.0.1:8080")
	f.StringVar(&fl.apiKey, "api-key", "", "API key of a tenant with reports: true (with --url; visible in the process list: prefer --api-key-env)")
	f.StringVar(&fl.keyEnv, "api-key-env", apiKeyEnv, "environment variable holding that API key, when --api-key is not given")
	f.StringSliceVar(&fl.natsURLs, "nats", nil, "NATS servers of the records stream, comma-separated")
	f.StringVar(&fl.natsSeed, "nats-nkey-seed", "", "nkey seed file of the observer user hedgerow nats-auth wrote (with --nats)")
	f.StringVar(&fl.natsInbox, "nats-inbox-prefix", "", "inbox prefix of that user, e.g. _INBOX.ob (with --nats)")
	f.StringVar(&fl.stream, "stream", records.DefaultStream, "the records stream (records.stream of the configuration; with --nats)")
	f.StringVar(&fl.region, "region", "", "the region whose records the stream keeps (deployment.region of the configuration; with --nats and --stream)")
	f.DurationVar(&fl.since, "since", 0, "report the groups of this last span only, e.g. 10m (default: every kept record)")
	f.BoolVar(&fl.asJSON, "json", false, `print one JSON object {"total": {...}, "cohorts": [...]}, with "regions": {"REGION": {"total", "cohorts"}} when the records hold more than one region`)
	f.StringVar(&fl.plotPath, "plot", "", "also draw the hedged and control latency tails (log scales) to this file (.png, .svg or .pdf)")
	f.StringVar(&fl.exportPath, "export", "", "also write the records read to this file, one JSON record per line")
	f.Uint64Var(&fl.opts.Seed, "seed", hreport.DefaultSeed, "seed of the bootstrap (with --nats; a gateway uses the default)")
	f.IntVar(&fl.opts.Resamples, "resamples", hreport.DefaultResamples, "bootstrap resamples of the gain's interval (with --nats)")
	f.IntVar(&fl.opts.MinSamples, "min-samples", hreport.DefaultMinSamples, "groups each arm needs before the gain is shown (with --nats)")
	f.DurationVar(&fl.timeout, "timeout", 2*time.Minute, "give up reading after this long")
	return cmd
}

func (fl reportFlags) run(ctx context.Context, out io.Writer) error {
	var (
		rep  *hreport.Report
		recs *hreport.Records
		err  error
	)
	sinceTime := time.Time{}
	if fl.since > 0 {
		sinceTime = time.Now().Add(-fl.since)
	}
	if len(fl.natsURLs) > 0 {
		if recs, err = fl.readNATS(ctx, sinceTime); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		rep = hreport.Compute(recs, fl.opts)
	} else {
		key := fl.apiKey
		if key == "" {
			key = os.Getenv(fl.keyEnv)
		}
		gw := gatewayReports{root: strings.TrimRight(fl.url, "/"), key: key, since: fl.since, keyEnv: fl.keyEnv, keyFlag: fl.apiKey != ""}
		if rep, err = gw.report(ctx); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		if fl.plotPath != "" || fl.exportPath != "" {
			if recs, err = gw.records(ctx); err != nil {
				return fmt.Errorf("report: %w", err)
			}
		}
	}
	if err := printReport(out, rep, fl.asJSON); err != nil {
		return err
	}
	if fl.exportPath != "" {
		if err := writeExport(fl.exportPath, recs); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	if fl.plotPath != "" {
		if err := plotReport(fl.plotPath, hreport.Compute(recs, fl.opts), fl.since); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
}

// readNATS reads the records stream directly.
func (fl reportFlags) readNATS(ctx context.Context, since time.Time) (*hreport.Records, error) {
	var auth []nats.Option
	if fl.natsSeed != "" {
		seed, err := nats.NkeyOptionFromSeed(fl.natsSeed)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey-seed: %w", err)
		}
		auth = append(auth, seed)
	}
	if fl.natsInbox != "" {
		auth = append(auth, nats.CustomInboxPrefix(fl.natsInbox))
	}
	nc, err := node.Connect(fl.natsURLs, "hedgerow-report", nil, auth...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return records.Reader{JS: js, Stream: fl.stream, Region: fl.region}.Records(ctx, since)
}

// gatewayReports asks a gateway's report endpoints.
type gatewayReports struct {
	root, key string
	since     time.Duration
	// keyEnv is the variable the key was read from, unless keyFlag: it
	// came from --api-key. A 401 names them.
	keyEnv  string
	keyFlag bool
}

func (g gatewayReports) get(ctx context.Context, path string) (*http.Response, error) {
	u := g.root + path
	if g.since > 0 {
		u += "?since=" + url.QueryEscape(g.since.String())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("--url: %s", redact.Text(err.Error()))
	}
	if g.key != "" {
		req.Header.Set("Authorization", "Bearer "+g.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, errors.New(redact.Text(err.Error()))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var body struct {
			Error struct {
				Message string `json:"message"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body)
		answered := fmt.Errorf("%s: %s (%s): %s", path, resp.Status, body.Error.Code, body.Error.Message)
		if resp.StatusCode == http.StatusUnauthorized {
			if g.keyFlag {
				return nil, fmt.Errorf("the gateway refused the key --api-key gave: it is no tenant's key there (%w)", answered)
			}
			if g.key == "" {
				return nil, fmt.Errorf("the gateway needs the API key of a tenant with reports: true and $%s is not set: "+
					"export %s=<key> (deploy/examples/local.yaml's key is local-dev-key), or name another variable with --api-key-env (%w)",
					g.keyEnv, g.keyEnv, answered)
			}
			return nil, fmt.Errorf("the gateway refused the API key in $%s: it is no tenant's key there (%w)", g.keyEnv, answered)
		}
		return nil, answered
	}
	return resp, nil
}

func (g gatewayReports) report(ctx context.Context) (*hreport.Report, error) {
	resp, err := g.get(ctx, httpdoor.ReportPath)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var rep hreport.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return nil, fmt.Errorf("%s: not a report: %w", httpdoor.ReportPath, err)
	}
	return &rep, nil
}

func (g gatewayReports) records(ctx context.Context) (*hreport.Records, error) {
	resp, err := g.get(ctx, httpdoor.RecordsPath)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return hreport.ReadJSONL(resp.Body, httpdoor.RecordsPath)
}

func writeExport(path string, recs *hreport.Records) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--export: %w", err)
	}
	if err := recs.WriteJSONL(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("--export: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--export: %w", err)
	}
	return nil
}

// plotReport draws the report's tails (reportSeries).
func plotReport(path string, rep *hreport.Report, since time.Duration) error {
	span := "every kept record"
	if since > 0 {
		span = "the last " + since.String()
	}
	return tailplot.Write(path, fmt.Sprintf("hedgerow report: %d groups, %s", rep.Total.Groups, span), reportSeries(rep))
}

// reportSeries is what the report's plot draws: each cohort's hedged tail
// (thick) and control tail (dashed, its sample size in the legend like
// every series'), and the total's arms as pale grey bands beneath them — only for an arm that more
// than one cohort has latencies in, since the total of one cohort is that
// cohort's curve again and would hide it. A band still shows around a
// cohort that makes up nearly all of the total (one embeddings request
// beside thousands of chat ones).
func reportSeries(rep *hreport.Report) []tailplot.Series {
	var series []tailplot.Series
	hedgedIn, controlIn := 0, 0
	for i := range rep.Cohorts {
		c := &rep.Cohorts[i]
		hedged, control := c.HedgedLatencies(), c.ControlLatencies()
		if len(hedged) > 0 {
			hedgedIn++
		}
		if len(control) > 0 {
			controlIn++
		}
		series = append(series,
			tailplot.Series{Name: c.Cohort + " hedged", Latencies: hedged, Emphasis: true},
			tailplot.Series{Name: c.Cohort + " control", Latencies: control, Dashed: true})
	}
	if hedgedIn > 1 {
		series = append(series, tailplot.Series{Name: "total hedged", Latencies: rep.Total.HedgedLatencies(), Band: true})
	}
	if controlIn > 1 {
		series = append(series, tailplot.Series{Name: "total control", Latencies: rep.Total.ControlLatencies(), Band: true, Dashed: true})
	}
	return series
}
