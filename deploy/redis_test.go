package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestRedisProbesFailOnAWrongPassword runs the Redis probes of the
// Kubernetes StatefulSet (readiness and liveness) and of the compose
// service against a real redis-server with requirepass: each passes with
// the password and fails with a wrong one or none, where `redis-cli ping`
// alone, the probe they replace, exits 0 on all three. redis-cli is
// pointed at the test's server by a shim first on PATH, so the commands
// run as written.
func TestRedisProbesFailOnAWrongPassword(t *testing.T) {
	const password = "deploy-test-password"
	srv := redistest.Start(t, "--requirepass", password)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli is not installed: run make redis (Debian's redis-tools)")
	}
	shimDir := t.TempDir()
	shim := "#!/bin/sh\nexec " + cli + " -h 127.0.0.1 -p " + strings.TrimPrefix(srv.Addr(), "127.0.0.1:") + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(shimDir, "redis-cli"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}

	probes := map[string][]string{}
	for _, o := range overlays {
		ss := render(t, o).get(t, "StatefulSet", "hedgerow-redis").(*appsv1.StatefulSet)
		c := ss.Spec.Template.Spec.Containers[0]
		if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || c.LivenessProbe == nil || c.LivenessProbe.Exec == nil {
			t.Fatalf("%s: Redis's probes %+v %+v, want commands", o, c.ReadinessProbe, c.LivenessProbe)
		}
		probes[o+" readiness"] = c.ReadinessProbe.Exec.Command
		probes[o+" liveness"] = c.LivenessProbe.Exec.Command
	}
	hc := loadCompose(t)["redis"].Healthcheck.Test
	if len(hc) < 2 || hc[0] != "CMD" {
		t.Fatalf("compose's Redis health check %q, want a CMD", hc)
	}
	compose := make([]string, len(hc)-1)
	for i, a := range hc[1:] {
		compose[i] = strings.ReplaceAll(a, "$$", "$") // compose's escape of $
	}
	probes["compose"] = compose

	run := func(cmd []string, auth string, set bool) error {
		c := exec.Command(cmd[0], cmd[1:]...)
		c.Env = []string{"PATH=" + shimDir + string(os.PathListSeparator) + os.Getenv("PATH")}
		if set {
			c.Env = append(c.Env, "REDISCLI_AUTH="+auth)
		}
		return c.Run()
	}
	for _, tc := range []struct {
		name     string
		auth     string
		set      bool
		wantPass bool
	}{
		{"the password", password, true, true},
		{"a wrong password", "not-" + password, true, false},
		{"no password", "", false, false},
	} {
		for name, cmd := range probes {
			if err := run(cmd, tc.auth, tc.set); (err == nil) != tc.wantPass {
				t.Errorf("%s's probe %q with %s: err %v, want pass %v", name, cmd, tc.name, err, tc.wantPass)
			}
		}
		// The probe they replace passes whatever the password: what the
		// check above guards against.
		if err := run([]string{"redis-cli", "ping"}, tc.auth, tc.set); err != nil {
			t.Errorf("redis-cli ping with %s: %v; the server no longer answers NOAUTH with exit 0", tc.name, err)
		}
	}
}
