package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig/tlsconfigtest"
)

const tlsTestConfig = `
domain: sec
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: fail_deny
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: deny}
  - key: fail_allow
    rate_limit: {unit: minute, requests_per_unit: 100, failure_mode: allow}
`

// startRedisArgs starts redis-server on loopback with args added, and a
// client of the test's own made from opts (its Addr is filled in). A machine
// without redis-server fails the test, as startRedis does.
func startRedisArgs(t *testing.T, addr string, opts *redis.Options, args ...string) *redisServer {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH: install Debian's redis-server package (make test, or make tools, does)")
	}
	r := &redisServer{addr: addr}
	r.cmd = exec.Command(path, append([]string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	var out syncBuffer
	r.cmd.Stdout, r.cmd.Stderr = &out, &out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	opts.Addr = addr
	r.client = redis.NewClient(opts)
	t.Cleanup(func() {
		_ = r.client.Close() // the test's outcome is decided
		r.stop()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", out.String())
		}
	})
	waitFor(t, 5*time.Second, func() error { return r.client.Ping(context.Background()).Err() })
	return r
}

// startServerTLS is startServer for a service whose gRPC listener serves
// TLS: the test's connection uses client, and the service uses r, if any.
func startServerTLS(t *testing.T, r *redisServer, client *tls.Config, extra ...string) *server {
	t.Helper()
	return startServerWith(t, r, tlsTestConfig, credentials.NewTLS(client), extra...)
}

// tlsClient trusts ca and presents leaf (nil: no certificate).
func tlsClient(t *testing.T, ca *tlsconfigtest.CA, leaf *tlsconfigtest.Leaf) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if leaf != nil {
		cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// healthCheck asks for health on a connection of its own.
func healthCheck(addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// tripsAfterThree asks for key k=value four times: three OK, then over.
// k's limit is a fixed window of a minute: four hits that straddled its
// edge are asked again of another value (inOneWindow).
func tripsAfterThree(t *testing.T, s *server, value string) {
	t.Helper()
	want := []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}
	got := inOneWindow(t, time.Minute, func(attempt int) []rlsv3.RateLimitResponse_Code {
		var got []rlsv3.RateLimitResponse_Code
		for range want {
			got = append(got, s.ask(t, request("sec", descriptor("k", attemptValue(value, attempt)))).OverallCode)
		}
		return got
	})
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("hit %d: %v, want %v", i, got[i], want[i])
		}
	}
	if strings.Contains(s.logs.String(), "store unavailable") {
		t.Fatal("a failure mode answered: the store was not reached")
	}
}

// storeKeys are the keys of domain sec in r.
func storeKeys(t *testing.T, r *redisServer) []string {
	t.Helper()
	keys, err := r.client.Keys(context.Background(), "rl:{sec*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestGRPCMutualTLS(t *testing.T) {
	t.Parallel()
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		dir := t.TempDir()
		ca := tlsconfigtest.NewCA(t, "ca")
		other := tlsconfigtest.NewCA(t, "other")
		certFile, keyFile := ca.Server(t, "ratelimit").Write(t, dir, "server")
		caFile := ca.WriteCA(t, dir, "clients")
		envoy := tlsClient(t, ca, ca.Client(t, "envoy"))

		r := startRedis(t)
		s := startServerTLS(t, r, envoy,
			"--grpc-tls-cert", certFile, "--grpc-tls-key", keyFile, "--grpc-tls-client-ca", caFile, "--grpc-server", kind)
		tripsAfterThree(t, s, "mtls")
		if len(storeKeys(t, r)) == 0 {
			t.Fatal("no key in Redis")
		}

		if err := healthCheck(s.grpcAddr, credentials.NewTLS(tlsClient(t, ca, nil))); err == nil {
			t.Fatal("a client without a certificate passed a health check")
		}
		if err := healthCheck(s.grpcAddr, credentials.NewTLS(tlsClient(t, ca, other.Client(t, "mallory")))); err == nil {
			t.Fatal("a client with a certificate of another CA passed a health check")
		}
		if err := healthCheck(s.grpcAddr, insecure.NewCredentials()); err == nil {
			t.Fatal("a plaintext client passed a health check")
		}

		// Rotation without a restart: new handshakes get the new certificate.
		rotated := ca.Server(t, "ratelimit-rotated")
		rotated.Write(t, dir, "server")
		waitFor(t, tlsconfig.CheckInterval+10*time.Second, func() error {
			c, err := tls.Dial("tcp", s.grpcAddr, envoy)
			if err != nil {
				return err
			}
			defer c.Close()
			if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "ratelimit-rotated" {
				return fmt.Errorf("server presents %s", cn)
			}
			return nil
		})
		if err := healthCheck(s.grpcAddr, credentials.NewTLS(envoy)); err != nil {
			t.Fatalf("after the rotation: %v", err)
		}
		// The connection made before the rotation still works.
		s.ask(t, request("sec", descriptor("k", "after-rotation")))
	})
}

func TestGRPCTLSFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	certFile, keyFile := ca.Server(t, "ratelimit").Write(t, dir, "server")
	caFile := ca.WriteCA(t, dir, "ca")
	writeFile(t, dir+"/config.yaml", tlsTestConfig)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--grpc-tls-cert", certFile}, "--grpc-tls-key"},
		{[]string{"--grpc-tls-client-ca", caFile}, "--grpc-tls-cert"},
		{[]string{"--grpc-tls-cert", certFile, "--grpc-tls-key", keyFile, "--grpc-tls-client-ca", keyFile}, keyFile},
		{[]string{"--grpc-tls-cert", certFile, "--grpc-tls-key", dir + "/missing.key"}, "missing.key"},
		{[]string{"--redis-tls-ca", caFile}, "rediss://"},
		{[]string{"--redis-url", "rediss://127.0.0.1:1", "--redis-tls-cert", certFile}, "--redis-tls-key"},
	} {
		cmd := exec.Command(binary, append([]string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, tc.args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.says) {
			t.Errorf("%v: %v\n%s\nwant a failure that mentions %s", tc.args, err, out, tc.says)
		}
	}
}

// startTLSRedis starts a redis-server that serves TLS only and asks for a
// client certificate, and writes the files the service needs to reach it:
// the CA's certificate and a client certificate with its key.
func startTLSRedis(t *testing.T) (r *redisServer, caFile, clientCert, clientKey string) {
	t.Helper()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	redisCert, redisKey := ca.Server(t, "redis").Write(t, dir, "redis")
	caFile = ca.WriteCA(t, dir, "ca")
	clientCert, clientKey = ca.Client(t, "ratelimit").Write(t, dir, "client")
	port := freePort(t)
	admin := tlsClient(t, ca, ca.Client(t, "admin"))
	admin.ServerName = "127.0.0.1"
	r = startRedisArgs(t, "127.0.0.1:"+strconv.Itoa(port), &redis.Options{TLSConfig: admin},
		"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", redisCert, "--tls-key-file", redisKey, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "yes")
	return r, caFile, clientCert, clientKey
}

func TestRedisTLS(t *testing.T) {
	t.Parallel()
	r, caFile, clientCert, clientKey := startTLSRedis(t)
	url := "rediss://" + r.addr

	// No plaintext port: a plain client gets nowhere.
	plain := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	if err := plain.Ping(context.Background()).Err(); err == nil {
		t.Fatal("plaintext ping to the TLS port succeeded")
	}
	_ = plain.Close() // refused, as asked; nothing of the test's is in it

	s := startServer(t, nil, tlsTestConfig, "--redis-url", url,
		"--redis-tls-ca", caFile, "--redis-tls-cert", clientCert, "--redis-tls-key", clientKey)
	tripsAfterThree(t, s, "tls")
	if keys := storeKeys(t, r); len(keys) == 0 {
		t.Fatal("no key in Redis after decisions over TLS")
	}
	if strings.Contains(s.logs.String(), "store not reachable") {
		t.Fatal("the service did not reach Redis at start")
	}

	// Without a client certificate Redis (tls-auth-clients yes) refuses the
	// service, and the failure modes answer.
	noCert := startServer(t, nil, tlsTestConfig, "--redis-url", url, "--redis-tls-ca", caFile, "--store-timeout", "500ms")
	resp := noCert.ask(t, request("sec", descriptor("fail_deny", "x"), descriptor("fail_allow", "x")))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("no client certificate: %v, want the failure modes (deny, allow)", resp)
	}
	noCert.waitLog(t, "store unavailable")

	// A server name the Redis certificate does not hold is refused too.
	wrongName := startServer(t, nil, tlsTestConfig, "--redis-url", url, "--redis-tls-ca", caFile,
		"--redis-tls-cert", clientCert, "--redis-tls-key", clientKey, "--redis-tls-server-name", "elsewhere.example",
		"--store-timeout", "500ms")
	if got := wrongName.ask(t, request("sec", descriptor("fail_deny", "y"))).OverallCode; got != over {
		t.Fatalf("wrong server name: %v, want the deny failure mode", got)
	}
	wrongName.waitLog(t, "store unavailable")
}

func TestRedisACL(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	r := startRedisArgs(t, "127.0.0.1:"+strconv.Itoa(port), &redis.Options{Username: "alice", Password: "secret"},
		"--port", strconv.Itoa(port),
		"--user", "alice", "on", ">secret", "~*", "&*", "+@all",
		// bob may run scripts but not Redis Functions, as some ACLs and
		// managed services allow: the service falls back to scripts.
		"--user", "bob", "on", ">secret", "~*", "&*", "+@all", "-function", "-fcall",
		"--user", "default", "off")

	// The default user is off: no credentials, no access.
	anon := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	if err := anon.Set(context.Background(), "x", "1", 0).Err(); err == nil {
		t.Fatal("a client without credentials could write")
	}
	_ = anon.Close() // refused, as asked; nothing of the test's is in it

	s := startServer(t, nil, tlsTestConfig, "--redis-url", "redis://alice:secret@"+r.addr)
	tripsAfterThree(t, s, "acl")
	if keys := storeKeys(t, r); len(keys) == 0 {
		t.Fatal("no key in Redis after decisions as alice")
	}

	bob := startServer(t, nil, tlsTestConfig, "--redis-url", "redis://bob:secret@"+r.addr)
	tripsAfterThree(t, bob, "acl-scripts")
	if strings.Contains(bob.logs.String(), "store unavailable") {
		t.Fatal("a user without FUNCTION/FCALL got failure-mode answers: no fallback to scripts")
	}

	// A wrong password is a setting to fix: not ready (Kubernetes keeps
	// traffic away), and a request that comes anyway gets the failure modes.
	wrong := startProcess(t, nil, tlsTestConfig, insecure.NewCredentials(), "--redis-url", "redis://alice:wrong@"+r.addr)
	wrong.waitHealth(t, healthpb.HealthCheckResponse_NOT_SERVING)
	wrong.waitLog(t, "Redis refused the credentials")
	if code, _ := httpGet(t, "http://"+wrong.httpAddr+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d with a wrong password, want 503", code)
	}
	resp := wrong.ask(t, request("sec", descriptor("fail_deny", "x"), descriptor("fail_allow", "x")))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("wrong password: %v, want the failure modes (deny, allow)", resp)
	}
	wrong.waitLog(t, "store unavailable")
	if strings.Contains(wrong.logs.String(), "alice:wrong") {
		t.Fatal("the password of the URL is in the log")
	}
}
