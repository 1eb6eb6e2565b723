package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/report"
)

// serve with NATS users (its gateway reads the records stream with the
// gateway role's permissions) and two tenants, one allowed reports: the
// report endpoint counts the groups answered, for that tenant only.
func TestServesReportEndpointCountsTheAnsweredGroupsForTenantsAllowedReports(t *testing.T) {
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), fmt.Sprintf(`tenants:
  ops: {api_key_hashes: [%q], reports: true}
  caller: {api_key_hashes: [%q]}
`, config.HashAPIKey("ops-key"), config.HashAPIKey("caller-key")))
	localUsers(t, cfg)
	cfg.NATS.StoreDir = t.TempDir()
	s, err := StartServe(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	base := "http://" + s.HTTPAddr().String()
	const chats = 3
	for range chats {
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"hello"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer caller-key")
		if code, body := do(t, req); code != http.StatusOK {
			t.Fatalf("chat: %d %s", code, body)
		}
	}
	reportAs := func(key string) (int, []byte) {
		req, err := http.NewRequest(http.MethodGet, base+httpdoor.ReportPath+"?since=1h", nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		return do(t, req)
	}
	for key, want := range map[string]int{"": http.StatusUnauthorized, "caller-key": http.StatusForbidden} {
		if code, body := reportAs(key); code != want {
			t.Errorf("report with key %q: %d %s, want %d", key, code, body, want)
		}
	}
	// Each answered group's record was kept before its answer left.
	code, body := reportAs("ops-key")
	var rep report.Report
	if err := json.Unmarshal(body, &rep); err != nil || code != http.StatusOK {
		t.Fatalf("report: %d %v %s", code, err, body)
	}
	if rep.Total.Groups != chats || len(rep.Cohorts) != 1 || rep.Total.Usage.Winners == 0 {
		t.Fatalf("report of %d chats: %s", chats, body)
	}
}
