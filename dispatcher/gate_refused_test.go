package dispatcher

import (
	"context"
	"errors"
	"testing"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// refusingGate is a winner gate no store answers: every claim is refused
// as arbiter.ErrGateUnavailable, as when neither Redis nor the ledger can
// decide (a stream without a leader).
type refusingGate struct{}

func (refusingGate) Claim(context.Context, string, string, int) (arbiter.Claim, error) {
	return arbiter.Claim{}, arbiter.ErrGateUnavailable
}

func (refusingGate) Clear(context.Context, arbiter.Claim) error { return nil }

// A group whose commit no gate could decide fails gate_unavailable (503,
// retry): its attempts' ledger slots are forgiven, so the retry it asks for
// runs instead of finding the user action's allowance spent by the outage;
// past the forgiveness bound the refusal still names when to retry.
func TestARetryAfterTheGateCouldNotDecideIsNotRefusedBudgetExhausted(t *testing.T) {
	ps := map[string]*provider{"a": newProvider(t, "a", newScript(behaviour{words: 3}))}
	c := newCluster(t, []string{"a"}, ps, `
policies:
  default:
    control_fraction: 0
    max_attempts: 1
    deadline: 3s
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
`)
	d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: refusingGate{}})
	submit := func() *GroupError {
		t.Helper()
		_, err := d.Submit(context.Background(), Submission{Pool: "general", Tenant: "acme", IdempotencyKey: "order-7", Request: chat(false)}, nil)
		var ge *GroupError
		if !errors.As(err, &ge) {
			t.Fatalf("Submit = %v, want a GroupError", err)
		}
		return ge
	}
	for try := 1; try <= 2; try++ {
		if ge := submit(); ge.Code != schemas.ErrGateUnavailable {
			t.Fatalf("try %d: %s; want gate_unavailable: the earlier try's slot was forgiven", try, ge.Code)
		}
	}
	// max_attempts 1 forgives one slot per ledger lifetime: the third try
	// finds the allowance spent, and is told when it comes back.
	if ge := submit(); ge.Code != schemas.ErrBudgetExhausted || ge.RetryAfter <= 0 {
		t.Fatalf("try 3: %s, retry after %v; want budget_exhausted with a Retry-After", ge.Code, ge.RetryAfter)
	}
}
