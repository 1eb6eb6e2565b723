//go:build image

// Package image_test runs the image (`make image-test`, after `make
// image`) as production runs it — read-only root file system, no
// capabilities, no new privileges, the image's own user — under podman:
// serve in front of two fake routes (the image's own `hedgerow fakellm`)
// answers /readyz (and the image's own `hedgerow healthcheck` says so
// from inside), a chat completion and a stream, and stops cleanly on
// SIGTERM; a gateway and a worker of the image, against a NATS server of
// the test's, answer a chat completion together. Every process is checked
// from the host's /proc: uid and gid 65532, no capability, no new
// privileges, its root mounted read-only. The containers share the host's
// network, so they reach each other and the test's NATS server on
// loopback. Build tag image: it needs podman and the image.
package image_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	imageName  = flag.String("image", "localhost/hedgerow:dev", "the image under test (make image builds it)")
	podmanConf = flag.String("podman-conf", "", "the containers.conf podman reads (make podman writes bin/podman/containers.conf)")
)

// Bounds of the image tests' waits; a healthy run takes a second or two of each.
const (
	containerStart = 60 * time.Second
	containerStop  = 40 * time.Second
)

// imageUser is the user the Dockerfile's final stage runs as.
const imageUser = 65532

// podman runs podman with args and returns its standard output, failing
// the test with its standard error when it fails.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := podmanCmd(args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}

func podmanCmd(args ...string) *exec.Cmd {
	cmd := exec.Command("podman", args...)
	cmd.Env = os.Environ()
	if *podmanConf != "" {
		cmd.Env = append(cmd.Env, "CONTAINERS_CONF="+*podmanConf)
	}
	return cmd
}

// container is one running container of the image.
type container struct {
	name string
}

// runImage starts the image with args (a hedgerow command and its flags)
// as production runs it, with dir, when set, mounted read-only at
// /etc/hedgerow; the test's cleanup removes it, printing its log when the
// test failed.
func runImage(t *testing.T, role, dir string, args ...string) container {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: run make image-test, which installs it (Debian's package)")
	}
	c := container{name: fmt.Sprintf("hedgerow-imagetest-%d-%s", os.Getpid(), role)}
	run := []string{"run", "--detach", "--name", c.name, "--network", "host",
		"--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
		// serve's JetStream state: the image's volume path, on memory,
		// owned by the container's user (U).
		"--tmpfs", "/var/lib/hedgerow:rw,U"}
	if dir != "" {
		run = append(run, "--volume", dir+":/etc/hedgerow:ro")
	}
	podman(t, append(append(run, *imageName), args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := podmanCmd("logs", c.name).CombinedOutput()
			t.Logf("%s's log:\n%s", c.name, out)
		}
		if out, err := podmanCmd("rm", "--force", "--time", "0", c.name).CombinedOutput(); err != nil {
			t.Errorf("podman rm %s: %v\n%s", c.name, err, out)
		}
	})
	return c
}

// checkConfined fails unless the container's process runs as the image's
// user, with no capability, no new privileges and a read-only root.
func (c container) checkConfined(t *testing.T) {
	t.Helper()
	pid := podman(t, "inspect", "--format", "{{.State.Pid}}", c.name)
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	id := strconv.Itoa(imageUser)
	for key, want := range map[string]string{
		"Uid": strings.Repeat(id+" ", 3) + id, "Gid": strings.Repeat(id+" ", 3) + id,
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	} {
		if fields[key] != want {
			t.Errorf("%s: %s is %q, want %q", c.name, key, fields[key], want)
		}
	}
	mounts, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	rootRO := false
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			rootRO = strings.HasPrefix(f[5], "ro,") || f[5] == "ro"
		}
	}
	if !rootRO {
		t.Errorf("%s: the root file system is mounted read-write:\n%s", c.name, mounts)
	}
}

// checkHealthcheck runs the image's own health check (`hedgerow
// healthcheck URL`, what compose's health checks run: the image has no
// shell or curl) inside the container: it passes on url and fails on a
// path that answers 404.
func (c container) checkHealthcheck(t *testing.T, url string) {
	t.Helper()
	podman(t, "exec", c.name, "/hedgerow", "healthcheck", url)
	if out, err := podmanCmd("exec", c.name, "/hedgerow", "healthcheck", url+"-not-a-path").CombinedOutput(); err == nil {
		t.Errorf("%s: hedgerow healthcheck passed on a 404:\n%s", c.name, out)
	}
}

// stop sends SIGTERM and fails unless the process exits 0 within containerStop.
func (c container) stop(t *testing.T) {
	t.Helper()
	podman(t, "stop", "--time", strconv.Itoa(int(containerStop/time.Second)), c.name)
	if code := podman(t, "inspect", "--format", "{{.State.ExitCode}}", c.name); code != "0" {
		t.Errorf("%s exited %s on SIGTERM, want 0", c.name, code)
	}
}

// writeConfigDir writes hedgerow.yaml into a new folder the image's user
// can read, to mount at /etc/hedgerow.
func writeConfigDir(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hedgerow.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitReady polls url until it answers 200.
func waitReady(t *testing.T, url string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	eventually.True(t, containerStart, url+" to answer 200", func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// checkAnswers sends a chat completion and a streamed one to base and
// fails unless both are answered whole.
func checkAnswers(t *testing.T, base string) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	post := func(stream bool) *http.Response {
		body := fmt.Sprintf(`{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":16,"stream":%t}`, stream)
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("stream %v: %v", stream, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("stream %v: status %d: %s", stream, resp.StatusCode, b)
		}
		return resp
	}

	resp := post(false)
	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	err := json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil || len(answer.Choices) != 1 || answer.Choices[0].Message.Content == "" || answer.Choices[0].FinishReason == "" {
		t.Fatalf("chat completion %+v (%v), want one finished choice with content", answer, err)
	}

	resp = post(true)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("stream's Content-Type %q", ct)
	}
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		switch {
		case !ok:
		case string(data) == "[DONE]":
			done = true
		case done:
			t.Fatalf("data after [DONE]: %s", data)
		default:
			if !json.Valid(data) {
				t.Fatalf("stream chunk is not JSON: %s", data)
			}
			chunks++
		}
	}
	if err := sc.Err(); err != nil || !done || chunks == 0 {
		t.Fatalf("stream: %d chunks, [DONE] %v, %v; want chunks then [DONE]", chunks, done, err)
	}
}

// fakeRoutes starts two fake routes of the image (`hedgerow fakellm
// --instant`: every answer at once, never failing) and returns the
// configuration of them as pool general, with a policy that has room for
// a loaded machine.
func fakeRoutes(t *testing.T) string {
	t.Helper()
	var urls []string
	for i, name := range []string{"fake-a", "fake-b"} {
		listen := natstest.FreeAddr(t)
		c := runImage(t, name, "", "fakellm", "--listen", listen, "--route", strconv.Itoa(i), "--instant", "8")
		waitReady(t, "http://"+listen+"/healthz")
		c.checkConfined(t)
		c.checkHealthcheck(t, "http://"+listen+"/healthz")
		urls = append(urls, "http://"+listen+"/v1")
	}
	return fmt.Sprintf(`routes:
  - {name: fake-a, provider: openai, base_url: %q, model: fake}
  - {name: fake-b, provider: openai, base_url: %q, model: fake}
pools:
  general: {routes: [fake-a, fake-b]}
policies:
  default: {deadline: 20s, accept_timeout: 5s, heartbeat_timeout: 5s}
`, urls[0], urls[1])
}

func TestImageServeAnswersConfinedAndStopsCleanly(t *testing.T) {
	listen := natstest.FreeAddr(t)
	dir := writeConfigDir(t, fmt.Sprintf("http: {listen: %q}\n", listen)+fakeRoutes(t))
	c := runImage(t, "serve", dir, "serve", "--config", "/etc/hedgerow/hedgerow.yaml")
	waitReady(t, "http://"+listen+"/readyz")
	c.checkConfined(t)
	c.checkHealthcheck(t, "http://"+listen+"/readyz")
	checkAnswers(t, "http://"+listen)
	c.stop(t)
}

func TestImageGatewayAndWorkerAnswerThroughNATS(t *testing.T) {
	ns := natstest.Start(t, natstest.JetStream(t.TempDir()), natstest.MaxPayload(8<<20))
	listen, internal, metrics := natstest.FreeAddr(t), natstest.FreeAddr(t), natstest.FreeAddr(t)
	dir := writeConfigDir(t, fmt.Sprintf("nats: {urls: [%q]}\nhttp: {listen: %q, internal_listen: %q}\n",
		ns.ClientURL(), listen, internal)+fakeRoutes(t))
	worker := runImage(t, "worker", dir, "worker", "--config", "/etc/hedgerow/hedgerow.yaml", "--metrics-listen", metrics)
	gateway := runImage(t, "gateway", dir, "gateway", "--config", "/etc/hedgerow/hedgerow.yaml")
	waitReady(t, "http://"+metrics+"/readyz")
	waitReady(t, "http://"+internal+"/readyz")
	worker.checkConfined(t)
	gateway.checkConfined(t)
	worker.checkHealthcheck(t, "http://"+metrics+"/readyz")
	gateway.checkHealthcheck(t, "http://"+internal+"/readyz")
	checkAnswers(t, "http://"+listen)
	gateway.stop(t)
	worker.stop(t)
}
