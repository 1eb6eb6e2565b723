package dispatcher_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/natsdoor"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// The NATS door authenticates its callers as tenants, so a tenant's spend
// window applies over NATS as over HTTP (TestHTTPTenantOfTheAPIKeyIsChargedItsSpendWindow):
// the Go client sends the key with client.WithAPIKey.
func TestNATSTenantOfTheAPIKeyIsChargedItsSpendWindow(t *testing.T) {
	const metered = `
  metered:
    control_fraction: 0
    deadline: 3s
    spend: {per_tenant_window: 100, window: 1h}
`
	keyring := frontdoor.NewKeyring(map[string][]string{"acme": {policy.HashAPIKey("good-key")}})
	for _, tc := range []struct {
		name      string
		keyring   *frontdoor.Keyring
		key       string
		maxTokens int
		code      schemas.ErrorCode // "" for an answer
		status    int
	}{
		{"a keyed caller's request that fits its tenant's window", keyring, "good-key", 50, "", 0},
		{"a keyed caller's request beyond its tenant's window", keyring, "good-key", 500, schemas.ErrBudgetExhausted, 429},
		{"a caller with a wrong key, before anything runs", keyring, "bad-key", 50, schemas.ErrUnauthenticated, 401},
		{"a caller with no key", keyring, "", 50, schemas.ErrUnauthenticated, 401},
		{"a keyless caller of a door without tenants, who has no tenant window", nil, "", 500, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := dispatcher.NewTestScript(dispatcher.Words(2))
			providers := map[string]*dispatcher.TestProvider{"a": dispatcher.NewTestProvider(t, "a", sc), "b": dispatcher.NewTestProvider(t, "b", sc)}
			c := dispatcher.NewTestCluster(t, []string{"a", "b"}, providers, metered)
			s, err := natsdoor.Start(c.Dispatcher(), natstest.Connect(t, c.Server()), natsdoor.Options{DispatcherID: c.Dispatcher().ID(), Keyring: tc.keyring})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), natsWait)
				defer cancel()
				if err := s.Stop(ctx); err != nil {
					t.Errorf("Stop: %v", err)
				}
			})
			opts := []client.Option{client.WithTimeout(natsWait)}
			if tc.key != "" {
				opts = append(opts, client.WithAPIKey(tc.key))
			}
			cl, err := client.New(natstest.Connect(t, c.Server()), opts...)
			if err != nil {
				t.Fatal(err)
			}
			req := dispatcher.TestChat(false)
			req.MaxTokens = tc.maxTokens
			resp, err := cl.Submit(context.Background(), client.Request{OperationClass: "metered", ModelClass: "general", Request: req})
			if tc.code == "" {
				if err != nil || resp.Content == "" {
					t.Fatalf("Submit = %+v, %v; want an answer", resp, err)
				}
				return
			}
			herr, ok := errors.AsType[*client.Error](err)
			if !ok || herr.Code != tc.code || herr.Status != tc.status {
				t.Fatalf("Submit error %v; want %s (%d)", err, tc.code, tc.status)
			}
			if tc.code == schemas.ErrUnauthenticated && len(providers["a"].Arrived())+len(providers["b"].Arrived()) != 0 {
				t.Fatal("an unauthenticated request reached a provider")
			}
		})
	}
}
