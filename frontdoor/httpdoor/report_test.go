package httpdoor

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/adapters/records/recordstest"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/report/reporttest"
)

// keptRecords keeps generated records in a real JetStream stream, one
// group a second from start, and returns its reader and the records.
func keptRecords(t *testing.T, groups int, start time.Time) (records.Reader, [][]byte) {
	t.Helper()
	srv := natstest.Start(t, natstest.JetStream(t.TempDir()))
	nc := natstest.Connect(t, srv)
	p, err := records.Open(context.Background(), nc, records.Options{Stream: "door_records", MaxAge: time.Hour,
		MaxBytes: 64 << 20, Replicas: 1, Duplicates: time.Minute, MaxPending: 4096, CommitTimeout: 5 * time.Second},
		prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := reporttest.Records(21, groups, start)
	if err != nil {
		t.Fatal(err)
	}
	recordstest.Keep(t, p, lines)
	return p.Reader(), lines
}

func getWithKey(t *testing.T, url, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp, buf.Bytes()
}

func TestReportEndpointsAnswerOnlyTenantsAllowedToReadReports(t *testing.T) {
	start := time.Now().Add(-400 * time.Second)
	reader, lines := keptRecords(t, 400, start)
	srv := frontDoor(t, frontdoortest.New(nil), Options{
		// The door's clock: ?since counts back from the 400th group.
		Now: func() time.Time { return start.Add(400 * time.Second) },
		Keyring: frontdoor.NewKeyring(map[string][]string{
			"ops": {policy.HashAPIKey("ops-key")}, "caller": {policy.HashAPIKey("caller-key")}}),
		Records: reader, ReportTenants: map[string]bool{"ops": true},
	})
	for _, tc := range []struct {
		name, path, key string
		status          int
		code            string
	}{
		{"no key", ReportPath, "", http.StatusUnauthorized, frontdoor.CodeInvalidAPIKey},
		{"unknown key", RecordsPath, "nobody's", http.StatusUnauthorized, frontdoor.CodeInvalidAPIKey},
		{"tenant without reports", ReportPath, "caller-key", http.StatusForbidden, frontdoor.CodePermissionDenied},
		{"tenant without reports, records", RecordsPath, "caller-key", http.StatusForbidden, frontdoor.CodePermissionDenied},
		{"bad since", ReportPath + "?since=soon", "ops-key", http.StatusBadRequest, frontdoor.CodeInvalidValue},
		{"negative since", ReportPath + "?since=-1m", "ops-key", http.StatusBadRequest, frontdoor.CodeInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := getWithKey(t, srv.URL+tc.path, tc.key)
			_, code, _ := openAIErrorOf(t, body)
			if resp.StatusCode != tc.status || code != tc.code {
				t.Errorf("%d %s (%s), want %d %s", resp.StatusCode, code, body, tc.status, tc.code)
			}
		})
	}

	want, err := report.ReadJSONL(bytes.NewReader(bytes.Join(lines, []byte("\n"))), "lines")
	if err != nil {
		t.Fatal(err)
	}
	resp, body := getWithKey(t, srv.URL+ReportPath, "ops-key")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("report: %d %s", resp.StatusCode, body)
	}
	wantJSON, err := json.Marshal(report.Compute(want, report.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(body), wantJSON) {
		t.Errorf("report endpoint:\n%s\nwant the report of the records kept:\n%s", body, wantJSON)
	}

	resp, body = getWithKey(t, srv.URL+ReportPath+"?since=100s", "ops-key")
	var rep report.Report
	if err := json.Unmarshal(body, &rep); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("report since 100s: %d %v %s", resp.StatusCode, err, body)
	}
	if rep.Total.Groups != 100 {
		t.Errorf("since 100s: %d groups, want the last 100 of one a second", rep.Total.Groups)
	}

	resp, body = getWithKey(t, srv.URL+RecordsPath, "ops-key")
	got, err := report.ReadJSONL(bytes.NewReader(body), "records endpoint")
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("records: %d %s %v", resp.StatusCode, resp.Header.Get("Content-Type"), err)
	}
	if got.Len() != want.Len() {
		t.Errorf("records endpoint: %d records, want the %d kept", got.Len(), want.Len())
	}
}

// A span of more records than the gateway may hold for one request is
// refused naming since, before any is read; one within the limit is
// answered.
func TestAReportOverMoreRecordsThanTheGatewayMayHoldAsksForAShorterSince(t *testing.T) {
	start := time.Now().Add(-100 * time.Second)
	reader, lines := keptRecords(t, 100, start)
	reader.Limit = len(lines) / 4
	srv := frontDoor(t, frontdoortest.New(nil), Options{
		Now:     func() time.Time { return start.Add(100 * time.Second) },
		Records: reader,
	})
	for _, path := range []string{ReportPath, RecordsPath} {
		resp, body := getWithKey(t, srv.URL+path, "")
		_, code, param := openAIErrorOf(t, body)
		if resp.StatusCode != http.StatusBadRequest || code != frontdoor.CodeInvalidValue || param != "since" {
			t.Errorf("%s over every record: %d %s param %q (%s), want 400 %s naming since", path, resp.StatusCode, code, param, body, frontdoor.CodeInvalidValue)
		}
	}
	reader.Limit = len(lines)
	within := frontDoor(t, frontdoortest.New(nil), Options{Records: reader})
	if resp, body := getWithKey(t, within.URL+ReportPath, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("records within the limit: %d %s", resp.StatusCode, body)
	}
}

func TestReportEndpointsSay503WhenNoRecordsAreKept(t *testing.T) {
	srv := frontDoor(t, frontdoortest.New(nil), Options{Records: records.Reader{}})
	resp, body := getWithKey(t, srv.URL+ReportPath, "")
	if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusServiceUnavailable || code != "unavailable" {
		t.Errorf("%d %s, want 503 unavailable", resp.StatusCode, body)
	}
}

func TestWithoutARecordSourceThereIsNoReportEndpoint(t *testing.T) {
	srv := frontDoor(t, frontdoortest.New(nil), Options{})
	resp, body := getWithKey(t, srv.URL+ReportPath, "")
	if _, code, _ := openAIErrorOf(t, body); resp.StatusCode != http.StatusNotFound || code != frontdoor.CodeUnknownURL {
		t.Errorf("%d %s, want 404 unknown_url", resp.StatusCode, body)
	}
}
