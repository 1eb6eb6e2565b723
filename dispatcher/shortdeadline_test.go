package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// TestAShortCallerDeadlineEndsDeadlineExceeded: however short the caller's
// deadline — shorter than an attempt needs to be worth sending — the group
// ends deadline_exceeded (504), never as if every route had failed (503).
func TestAShortCallerDeadlineEndsDeadlineExceeded(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond} {
		t.Run(fmt.Sprint(d), func(t *testing.T) {
			c, _ := twoRoutes(t, newScript(behaviour{firstByte: 2 * time.Second, words: 2}))
			_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false), Deadline: d}, nil)
			ge, ok := errors.AsType[*GroupError](err)
			if !ok || ge.Code != schemas.ErrDeadlineExceeded {
				t.Fatalf("Submit with a %v deadline = %v, want deadline_exceeded", d, err)
			}
		})
	}
}
