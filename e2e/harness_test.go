// Package e2e runs the real binary against a real redis-server, both started
// by the tests on free loopback ports, and talks to it as Envoy does. Where
// no process boundary is under test, the service runs in the test's process
// instead, through the public API (startLibrary), still on a redis-server.
//
// The tests that load the CPU and need it, or bound the time of what they
// see (attacks, the flood, overload, failovers and faults answered within the
// store deadline, announced waits, shutdown), run one at a time, first; every
// other test calls t.Parallel and runs after them, beside the others.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// binary is the service, built once for all tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimit-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "ratelimit")
	build := exec.Command("go", "build", "-race", "-o", binary, "../cmd/ratelimit")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the service:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "removing the built service:", err)
	}
	os.Exit(code)
}

// The tests' ports come from below Linux's ephemeral range (32768-60999 by
// default), from which every outgoing connection and every ":0" listener
// of the tests running beside these draws: a port picked there can be
// taken by one of them between its pick and the service's bind. Each port
// is handed out once per run.
const portsFrom, portsTo = 20000, 32768

var (
	portMu    sync.Mutex
	portNext  = portsFrom + rand.IntN(portsTo-portsFrom)
	handedOut = map[int]bool{}
)

// freePort returns a loopback port nothing listens on, and that no other
// test of this run was given.
func freePort(t *testing.T) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for range portsTo - portsFrom {
		p := portNext
		if portNext++; portNext == portsTo {
			portNext = portsFrom
		}
		if handedOut[p] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken
		}
		_ = ln.Close() // only a probe
		handedOut[p] = true
		return p
	}
	t.Fatalf("no free loopback port in %d-%d", portsFrom, portsTo-1)
	return 0
}

// syncBuffer collects a process's output for the failure report.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// redisServer is a redis-server process of the test's own.
type redisServer struct {
	addr   string
	cmd    *exec.Cmd
	client *redis.Client
}

// startRedis starts redis-server on a free loopback port. A machine without
// redis-server fails the test: these tests never skip.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH: install Debian's redis-server package (make test, or make tools, does)")
	}
	port := freePort(t)
	r := &redisServer{addr: "127.0.0.1:" + strconv.Itoa(port)}
	r.cmd = exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	var out syncBuffer
	r.cmd.Stdout, r.cmd.Stderr = &out, &out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.client = redis.NewClient(&redis.Options{Addr: r.addr})
	t.Cleanup(func() {
		_ = r.client.Close() // the test's outcome is decided
		r.stop()
	})
	waitFor(t, 5*time.Second, func() error { return r.client.Ping(context.Background()).Err() })
	return r
}

func (r *redisServer) stop() {
	if r.cmd.Process != nil {
		// It may have exited, or been stopped, already; once killed, its
		// exit status says only that.
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// server is a running ratelimit process.
type server struct {
	cmd       *exec.Cmd
	configDir string
	grpcAddr  string
	httpAddr  string
	logs      *syncBuffer
	conn      *grpc.ClientConn
	rls       rlsv3.RateLimitServiceClient
	health    healthpb.HealthClient
	exited    chan error
}

// grpcServers are the choices of --grpc-server: the core cases run on each,
// so that the escape hatch keeps the service's guarantees.
var grpcServers = []string{"lean", "grpc-go"}

// onEachGRPCServer runs f as a subtest for each of grpcServers; f passes
// "--grpc-server", kind to the service it starts.
func onEachGRPCServer(t *testing.T, f func(t *testing.T, kind string)) {
	t.Helper()
	for _, kind := range grpcServers {
		t.Run(kind, func(t *testing.T) { f(t, kind) })
	}
}

// startServer runs the binary on configYAML with its own ports; extra flags
// come last and win.
func startServer(t *testing.T, r *redisServer, configYAML string, extra ...string) *server {
	t.Helper()
	return startServerWith(t, r, configYAML, insecure.NewCredentials(), extra...)
}

// startServerWith is startServer whose test connection uses creds.
func startServerWith(t *testing.T, r *redisServer, configYAML string, creds credentials.TransportCredentials, extra ...string) *server {
	t.Helper()
	s := startProcess(t, r, configYAML, creds, extra...)
	s.waitHealth(t, healthpb.HealthCheckResponse_SERVING)
	return s
}

// startProcess starts the binary as startServerWith does, without waiting
// for it to be ready.
func startProcess(t *testing.T, r *redisServer, configYAML string, creds credentials.TransportCredentials, extra ...string) *server {
	t.Helper()
	return startProcessOf(t, binary, r, configYAML, creds, extra...)
}

// startProcessOf is startProcess of the service binary at bin.
func startProcessOf(t *testing.T, bin string, r *redisServer, configYAML string, creds credentials.TransportCredentials, extra ...string) *server {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(configYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &server{
		configDir: dir,
		grpcAddr:  "127.0.0.1:" + strconv.Itoa(freePort(t)),
		httpAddr:  "127.0.0.1:" + strconv.Itoa(freePort(t)),
		logs:      &syncBuffer{},
		exited:    make(chan error, 1),
	}
	args := []string{"--config", dir, "--grpc-addr", s.grpcAddr, "--http-addr", s.httpAddr,
		"--log-level", "debug"}
	if i := slices.Index(extra, "--grpc-addr"); i >= 0 && i+1 < len(extra) {
		s.grpcAddr = extra[i+1] // an extra flag wins: the test dials it (a restart on the same port)
	}
	if r != nil {
		args = append(args, "--redis-url", "redis://"+r.addr)
	}
	s.cmd = exec.Command(bin, append(args, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		// It may have exited already (the exit error then tells why);
		// else the exit error is the kill's own. A test that cares about
		// the exit reads s.exited itself.
		_ = s.cmd.Process.Kill()
		exit := <-s.exited
		if t.Failed() {
			t.Logf("service exit: %v; output:\n%s", exit, s.logs)
		}
	})
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn, s.rls, s.health = conn, rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	return s
}

// waitHealth waits for the gRPC health status want.
func (s *server) waitHealth(t *testing.T, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	waitFor(t, 20*time.Second, func() error {
		select {
		case err := <-s.exited:
			s.exited <- err
			return fmt.Errorf("service exited: %v\n%s", err, s.logs)
		default:
		}
		resp, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if resp.Status != want {
			return fmt.Errorf("health %v, want %v", resp.Status, want)
		}
		return nil
	})
}

// entries builds a descriptor from key, value pairs.
func descriptor(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (s *server) ask(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func headerValue(resp *rlsv3.RateLimitResponse, key string) (string, bool) {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

var errNotYet = errors.New("not yet")

// waitLog waits for the service to log want: its output reaches the test
// through a copying goroutine, a little after the answer it goes with.
// waitCleanExit waits for a process signalled with SIGTERM to exit with
// status 0; exited is its exit channel, whose error is put back for the
// cleanup that reads it.
func waitCleanExit(t *testing.T, exited chan error) {
	t.Helper()
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v, want status 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("still running 15s after SIGTERM")
	}
}

func (s *server) waitLog(t *testing.T, want string) {
	t.Helper()
	waitFor(t, 3*time.Second, func() error {
		if !strings.Contains(s.logs.String(), want) {
			return fmt.Errorf("%q not in the service's log", want)
		}
		return nil
	})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// flushCode empties Redis's script cache and its function libraries, as a
// restart or a SCRIPT FLUSH / FUNCTION FLUSH by an operator would.
func flushCode(ctx context.Context, c *redis.Client) error {
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		return err
	}
	return c.FunctionFlush(ctx).Err()
}

// codeLoads is how many times Redis was given the decide code: FUNCTION
// LOAD calls, plus EVAL calls (the script fallback after NOSCRIPT).
func codeLoads(t *testing.T, c *redis.Client) int {
	t.Helper()
	stats := c.Info(context.Background(), "commandstats").Val()
	total := 0
	for _, name := range []string{"cmdstat_function|load:calls=", "cmdstat_eval:calls="} {
		if _, rest, ok := strings.Cut(stats, name); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			total += n
		}
	}
	return total
}

// windowCount is the count of the current window that the counter or fixed
// window at key holds: its value is "<window index>:<count>[:<previous>]".
func windowCount(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Split(v, ":")
	if len(fields) < 2 {
		t.Fatalf("%s holds %q, not a window counter", key, v)
	}
	n, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		t.Fatalf("%s holds %q: %v", key, v, err)
	}
	return n
}

// errorReplies counts the error replies of kind (the error's first word:
// MOVED, WRONGPASS) Redis gave since its statistics were last reset (INFO
// errorstats).
func errorReplies(t *testing.T, c *redis.Client, kind string) int {
	t.Helper()
	stats, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, found := strings.Cut(stats, "errorstat_"+kind+":count=")
	if !found {
		return 0
	}
	count, _, _ := strings.Cut(rest, "\r\n")
	v, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil {
		t.Fatalf("errorstats: %q: %v", rest, err)
	}
	return v
}
