package dispatcher

import (
	"context"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// Every record a dispatcher keeps carries its deployment's region, so
// `hedgerow report` can read them per region (docs/architecture.md §9);
// a dispatcher of a deployment of one region stamps none.
func TestRecordsCarryTheDispatchersRegionAndNoneWithoutOne(t *testing.T) {
	for _, tt := range []struct {
		name, region string
	}{
		{"a dispatcher without a region stamps none", ""},
		{"a dispatcher of region eu-west stamps it on the group and every attempt", "eu-west"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sc := newScript(behaviour{words: 3}, behaviour{hang: true})
			ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
			// The region's workers: a regional dispatcher's attempts go on
			// its region's wire only.
			c := newClusterWith(t, clusterOptions{routes: []string{"a", "b"}, providers: ps, region: tt.region})
			resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			g := c.groupRecord(resp.GroupID)
			if g.Region != tt.region || g.Outcome != schemas.GroupCommitted {
				t.Errorf("group record: region %q, outcome %s; want %q, committed", g.Region, g.Outcome, tt.region)
			}
			for n, a := range c.attemptRecords(resp.GroupID, resp.Attempts) {
				if a.Region != tt.region {
					t.Errorf("attempt %d: region %q, want %q", n, a.Region, tt.region)
				}
			}
		})
	}
}
