package dispatcher

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// admitFails is a budget store whose admissions fail with err.
type admitFails struct {
	budgets.Store
	err error
}

func (s admitFails) Admit(context.Context, budgets.AdmitRequest) (budgets.Admission, error) {
	return budgets.Admission{}, s.err
}

// TestAStoresInvalidAnswerIsNeverReadAsUnavailable: a store that is
// unreachable lets the primary run without it (hedges suppressed), but a
// store that refuses the figures as invalid works — running on would run
// with no ceiling — so the group fails invalid_request and no provider is
// called.
func TestAStoresInvalidAnswerIsNeverReadAsUnavailable(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode schemas.ErrorCode // empty: the answer is committed
	}{
		{"an unavailable store lets the primary run", errors.New("redis: connection refused"), ""},
		{"an invalid answer fails the request", budgets.ErrInvalidRequest, schemas.ErrInvalidRequest},
		{"a wrapped invalid answer fails the request", errors.Join(errors.New("admit"), budgets.ErrInvalidRequest), schemas.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, provs := twoRoutes(t, newScript(behaviour{words: 2}))
			d := c.addDispatcher(Options{Store: admitFails{Store: budgets.NewMemory(nil), err: tt.err}, Gate: c.d.gate})
			resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
			if tt.wantCode == "" {
				if err != nil || resp.Content == "" {
					t.Fatalf("Submit = %+v, %v; want the primary's answer", resp, err)
				}
				return
			}
			ge, ok := errors.AsType[*GroupError](err)
			if !ok || ge.Code != tt.wantCode {
				t.Fatalf("Submit err = %v, want a GroupError %s", err, tt.wantCode)
			}
			for name, p := range provs {
				if n := len(p.arrived); n != 0 {
					t.Errorf("route %s got %d requests, want none", name, n)
				}
			}
		})
	}
}

func TestMaxTokensOverThePoolsLimitIsABadRequest(t *testing.T) {
	tests := []struct {
		name      string
		maxTokens int
		refused   bool
	}{
		{"2^63-1 is refused before the budget store sees it", math.MaxInt64, true},
		{"one over the default limit is refused", DefaultMaxTokens + 1, true},
		{"the default limit itself is taken", DefaultMaxTokens, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := twoRoutes(t, newScript(behaviour{words: 2}))
			if got := c.d.MaxTokens("general"); got != DefaultMaxTokens {
				t.Fatalf("MaxTokens(general) = %d, want the default %d", got, DefaultMaxTokens)
			}
			req := chat(false)
			req.MaxTokens = tt.maxTokens
			_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: req}, nil)
			if refused := errors.Is(err, ErrMaxTokens) && errors.Is(err, ErrBadRequest); refused != tt.refused {
				t.Fatalf("Submit err = %v; refused as over max_tokens %v, want %v", err, refused, tt.refused)
			}
		})
	}
}
