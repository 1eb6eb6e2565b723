package dispatcher

import (
	"context"
	"testing"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// Every record a dispatcher keeps carries its deployment's region, so
// `hedgerow report` can read them per region (docs/architecture.md §9);
// a dispatcher of a deployment of one region stamps none.
func TestRecordsCarryTheDispatchersRegionAndNoneWithoutOne(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 3}, behaviour{hang: true}))
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	east := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Region: "eu-west"})
	for _, tt := range []struct {
		name   string
		d      *Dispatcher
		region string
	}{
		{"a dispatcher without a region stamps none", c.d, ""},
		{"a dispatcher of region eu-west stamps it on the group and every attempt", east, "eu-west"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tt.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
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
