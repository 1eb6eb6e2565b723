package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

// TestRedisProbesFailOnAWrongPassword runs the Redis probes of the
// Kubernetes StatefulSet (readiness and liveness, over TLS with the
// certificates `hedgerow nats-auth --tls` generates) and of the compose
// service (plain) against a real redis-server with requirepass, listening
// on both: each passes with the password and fails with a wrong one or
// none, where `redis-cli ping` alone, the probe they replace, exits 0 on
// all three. redis-cli is pointed at the test's server by a shim first on
// PATH and the certificates' folder moved under the test's, so the
// commands run as written.
func TestRedisProbesFailOnAWrongPassword(t *testing.T) {
	const password = "deploy-test-password"
	const tlsDir = "/etc/redis/tls/" // where the StatefulSet mounts them
	certs := t.TempDir()
	bundle := anyUsers(t)
	for _, f := range []string{natsauth.CAFile, natsauth.ServerCertFile, natsauth.ServerKeyFile} {
		write(t, filepath.Join(certs, f), bundle.TLS.Files[f])
	}
	tlsAddr := natstest.FreeAddr(t)
	srv := redistest.Start(t, "--requirepass", password,
		"--tls-port", strings.TrimPrefix(tlsAddr, "127.0.0.1:"), "--tls-auth-clients", "no",
		"--tls-cert-file", filepath.Join(certs, natsauth.ServerCertFile),
		"--tls-key-file", filepath.Join(certs, natsauth.ServerKeyFile),
		"--tls-ca-cert-file", filepath.Join(certs, natsauth.CAFile))
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli is not installed: run make redis (Debian's redis-tools)")
	}
	// A shim per listener: redis-cli at the test's server.
	shim := func(addr string) string {
		dir := t.TempDir()
		host, port, _ := strings.Cut(addr, ":")
		body := "#!/bin/sh\nexec " + cli + " -h " + host + " -p " + port + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, "redis-cli"), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	plain, overTLS := shim(srv.Addr()), shim(tlsAddr)

	type probe struct {
		cmd     []string
		shimDir string
	}
	probes := map[string]probe{}
	for _, o := range overlays {
		ss := render(t, o).get(t, "StatefulSet", "hedgerow-redis").(*appsv1.StatefulSet)
		c := ss.Spec.Template.Spec.Containers[0]
		if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || c.LivenessProbe == nil || c.LivenessProbe.Exec == nil {
			t.Fatalf("%s: Redis's probes %+v %+v, want commands", o, c.ReadinessProbe, c.LivenessProbe)
		}
		for name, cmd := range map[string][]string{"readiness": c.ReadinessProbe.Exec.Command, "liveness": c.LivenessProbe.Exec.Command} {
			moved := make([]string, len(cmd))
			for i, a := range cmd {
				moved[i] = strings.ReplaceAll(a, tlsDir, certs+"/")
			}
			probes[o+" "+name] = probe{moved, overTLS}
		}
	}
	// CMD-SHELL: compose runs its one string with /bin/sh -c (a CMD of
	// sh -c '…' podman-compose 1.0 splits again, and it always failed).
	hc := loadCompose(t)["redis"].Healthcheck.Test
	if len(hc) != 2 || hc[0] != "CMD-SHELL" {
		t.Fatalf("compose's Redis health check %q, want a CMD-SHELL", hc)
	}
	probes["compose"] = probe{[]string{"sh", "-c", strings.ReplaceAll(hc[1], "$$", "$")}, plain} // compose's escape of $

	run := func(p probe, auth string, set bool) error {
		c := exec.Command(p.cmd[0], p.cmd[1:]...)
		c.Env = []string{"PATH=" + p.shimDir + string(os.PathListSeparator) + os.Getenv("PATH")}
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
		for name, p := range probes {
			if err := run(p, tc.auth, tc.set); (err == nil) != tc.wantPass {
				t.Errorf("%s's probe %q with %s: err %v, want pass %v", name, p.cmd, tc.name, err, tc.wantPass)
			}
		}
		// The probe they replace passes whatever the password: what the
		// check above guards against.
		if err := run(probe{[]string{"redis-cli", "ping"}, plain}, tc.auth, tc.set); err != nil {
			t.Errorf("redis-cli ping with %s: %v; the server no longer answers NOAUTH with exit 0", tc.name, err)
		}
	}
}
