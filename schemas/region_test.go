package schemas

import (
	"strings"
	"testing"
	"time"
)

// Records carry their deployment's region (docs/architecture.md §9, §14):
// absent in a deployment of one region, so its records are byte for byte
// what they were before regions; present, a token the schema checks.
func TestARecordCarriesItsRegionOnlyWhenTheDeploymentNamesOne(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	attempt := AttemptRecord{EventTime: at, Reporter: ReporterDispatcher, UserActionID: "ua_1", HedgeGroupID: "g1",
		Attempt: 1, Role: RolePrimary, Route: "r1", RouteClass: "general", OperationClass: "chat", ModelClass: "general",
		CommitPoint: FirstToken, Outcome: OutcomeWinner, StatusClass: StatusOK, ErrorScope: ScopeNone,
		CostBand: CostLow, PromptFingerprint: "0123456789abcdef"}
	group := GroupRecord{EventTime: at, Reporter: ReporterDispatcher, UserActionID: "ua_1", HedgeGroupID: "g1",
		RouteClass: "general", OperationClass: "chat", ModelClass: "general", CommitPoint: FirstToken,
		Outcome: GroupCommitted, StatusClass: StatusOK, ErrorScope: ScopeNone, Attempts: 1, WinnerAttempt: 1,
		WinnerRole: RolePrimary, WinnerRoute: "r1", CostBand: CostLow, PromptFingerprint: "0123456789abcdef",
		GuardrailDecision: GuardrailAllow}
	withRegion := func(region string) (AttemptRecord, GroupRecord) {
		a, g := attempt, group
		a.Region, g.Region = region, region
		return a, g
	}
	tests := []struct {
		name   string
		region string
		// want is what the records say of their region: "" for no field.
		want  string
		valid bool
	}{
		{"a deployment of one region writes no region field", "", "", true},
		{"a named region is written as the deployment names it", "eu-west", `"region":"eu-west"`, true},
		{"a region that is not a token is refused by the schema", "EU West", `"region":"EU West"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, g := withRegion(tt.region)
			for _, rec := range []struct {
				kind string
				data []byte
			}{{KindAttemptRecord, mustMarshal(t, a)}, {KindGroupRecord, mustMarshal(t, g)}} {
				if got := strings.Contains(string(rec.data), `"region"`); got != (tt.want != "") ||
					tt.want != "" && !strings.Contains(string(rec.data), tt.want) {
					t.Errorf("%s: %s; want region %q", rec.kind, rec.data, tt.want)
				}
				if err := Validate(rec.kind, rec.data); (err == nil) != tt.valid {
					t.Errorf("%s: validate: %v, want valid %v", rec.kind, err, tt.valid)
				}
			}
		})
	}
	// The record of one region is, byte for byte, the record as written
	// before regions (this is its marshalling at the commit before the field).
	const before = `{"v":1,"event":"hedge_attempt_complete","event_time":"2026-01-01T00:00:00Z","reporter":"dispatcher","user_action_id":"ua_1","hedge_group_id":"g1","attempt":1,"role":"primary","route":"r1","route_class":"general","operation_class":"chat","model_class":"general","commit_point":"first_token","overall_deadline_ms":0,"elapsed_ms":0,"outcome":"winner","status_class":"ok","error_scope":"none","contract_valid":false,"cancellation_sent":false,"cancellation_observed":false,"usage_input_units":0,"usage_output_units":0,"usage_estimated":false,"cost_band":"low","duplicate_rate_window":0,"prompt_fingerprint":"0123456789abcdef"}`
	if got := mustMarshal(t, attempt); string(got) != before {
		t.Errorf("a record of one region changed:\n%s\nwant\n%s", got, before)
	}
}
