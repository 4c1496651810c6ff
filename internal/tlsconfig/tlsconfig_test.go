package tlsconfig_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig/tlsconfigtest"
	"github.com/slidingwindow/ratelimit/internal/waitfor"
)

// errorLog collects what onError receives.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// serve runs a TLS server on cfg that answers each connection with the
// common name of the client's certificate ("-" for none) and closes it.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		if err := ln.Close(); err != nil {
			t.Error(err)
		}
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				// This side's failures show as the client's: hello reads
				// the answer, and fails without it.
				_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				cn := "-"
				if peers := tc.ConnectionState().PeerCertificates; len(peers) > 0 {
					cn = peers[0].Subject.CommonName
				}
				_, _ = tc.Write([]byte(cn + "\n"))
			}()
		}
	}()
	return ln.Addr().String()
}

// hello connects with cfg and returns the server certificate and what the
// server answered. Under TLS 1.3 a refused client certificate only shows
// when the client reads, so it reads.
func hello(addr string, cfg *tls.Config) (*x509.Certificate, string, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return nil, "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return nil, "", err
	}
	return c.ConnectionState().PeerCertificates[0], strings.TrimSpace(line), nil
}

// clientConfig trusts ca and presents leaf (nil: no certificate).
func clientConfig(ca *tlsconfigtest.CA, leaf *tlsconfigtest.Leaf) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	if leaf != nil {
		cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			panic(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// eventually retries check until it passes, for past a reload interval.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	waitfor.NoError(t, tlsconfig.CheckInterval+5*time.Second, 50*time.Millisecond, what, check)
}

func TestServerTLSWithoutClientCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	certFile, keyFile := ca.Server(t, "server").Write(t, dir, "server")
	cfg, err := tlsconfig.NewServer(certFile, keyFile, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	cert, answer, err := hello(addr, clientConfig(ca, nil))
	if err != nil || cert.Subject.CommonName != "server" || answer != "-" {
		t.Fatalf("no client cert, no client CA: %v %q %v, want server cert and no peer", cert, answer, err)
	}
	// TLS 1.2 is the minimum.
	old := clientConfig(ca, nil)
	old.MaxVersion = tls.VersionTLS11
	if _, _, err := hello(addr, old); err == nil {
		t.Fatal("a TLS 1.1 client connected")
	}
}

func TestServerMTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	other := tlsconfigtest.NewCA(t, "other")
	certFile, keyFile := ca.Server(t, "server").Write(t, dir, "server")
	caFile := ca.WriteCA(t, dir, "ca")
	var errs errorLog
	cfg, err := tlsconfig.NewServer(certFile, keyFile, caFile, errs.add)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)

	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		good := clientConfig(ca, ca.Client(t, "alice"))
		good.MaxVersion = version
		if _, answer, err := hello(addr, good); err != nil || answer != "alice" {
			t.Fatalf("TLS %x, client cert of the CA: %q %v, want accepted as alice", version, answer, err)
		}
		none := clientConfig(ca, nil)
		none.MaxVersion = version
		if _, answer, err := hello(addr, none); err == nil {
			t.Fatalf("TLS %x, no client cert: accepted (%q)", version, answer)
		}
		stranger := clientConfig(ca, other.Client(t, "mallory"))
		stranger.MaxVersion = version
		if _, answer, err := hello(addr, stranger); err == nil {
			t.Fatalf("TLS %x, client cert of another CA: accepted (%q)", version, answer)
		}
	}
	if e := errs.all(); len(e) != 0 {
		t.Fatalf("errors reported without a reload: %v", e)
	}
}

func TestServerTLSRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	first := ca.Server(t, "first")
	certFile, keyFile := first.Write(t, dir, "server")
	caFile := ca.WriteCA(t, dir, "ca")
	var errs errorLog
	cfg, err := tlsconfig.NewServer(certFile, keyFile, caFile, errs.add)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	alice := clientConfig(ca, ca.Client(t, "alice"))
	serverCN := func(want string) func() error {
		return func() error {
			cert, _, err := hello(addr, alice)
			if err != nil {
				return err
			}
			if cert.Subject.CommonName != want {
				return errors.New("server presents " + cert.Subject.CommonName + ", want " + want)
			}
			return nil
		}
	}
	if err := serverCN("first")(); err != nil {
		t.Fatal(err)
	}

	// A new certificate and key: new handshakes present them.
	second := ca.Server(t, "second")
	second.Write(t, dir, "server")
	eventually(t, "after rotating the server certificate", serverCN("second"))
	cert, _, _ := hello(addr, alice)
	if cert.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("serial %v, want the new certificate's %v", cert.SerialNumber, second.Cert.SerialNumber)
	}

	// A broken certificate file: the previous pair stays, reported once.
	tlsconfigtest.WriteFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	eventually(t, "a broken certificate file is reported", func() error {
		if err := serverCN("second")(); err != nil {
			return err
		}
		if len(errs.all()) == 0 {
			return errors.New("no error reported yet")
		}
		return nil
	})
	// The files are looked at again only once the interval has passed, and
	// what is tested is that this look reports nothing new: nothing signals
	// a look that changes nothing, so real time passes.
	time.Sleep(tlsconfig.CheckInterval + 100*time.Millisecond)
	if err := serverCN("second")(); err != nil {
		t.Fatalf("with a broken certificate file: %v", err)
	}
	if e := errs.all(); len(e) != 1 || !strings.Contains(e[0].Error(), certFile) {
		t.Fatalf("reported %v, want one error naming %s", e, certFile)
	}

	// A certificate that does not match the key: kept too.
	third := ca.Server(t, "third")
	tlsconfigtest.WriteFile(t, certFile, third.CertPEM)
	eventually(t, "a mismatched key is reported", func() error {
		if err := serverCN("second")(); err != nil {
			return err
		}
		if len(errs.all()) < 2 {
			return errors.New("no error reported yet")
		}
		return nil
	})
	// Its key arrives: the pair loads.
	tlsconfigtest.WriteFile(t, keyFile, third.KeyPEM)
	eventually(t, "the key of the third certificate arrives", serverCN("third"))

	// A missing file: kept as well.
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a missing key file is reported", func() error {
		if err := serverCN("third")(); err != nil {
			return err
		}
		if len(errs.all()) < 3 {
			return errors.New("no error reported yet")
		}
		return nil
	})
	if e := errs.all(); !errors.Is(e[2], os.ErrNotExist) {
		t.Fatalf("missing key: %v, want an error wrapping os.ErrNotExist", e[2])
	}
}

func TestServerTLSClientCARotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldCA, newCA := tlsconfigtest.NewCA(t, "old"), tlsconfigtest.NewCA(t, "new")
	certFile, keyFile := oldCA.Server(t, "server").Write(t, dir, "server")
	caFile := oldCA.WriteCA(t, dir, "clients")
	cfg, err := tlsconfig.NewServer(certFile, keyFile, caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	oldClient := clientConfig(oldCA, oldCA.Client(t, "old-client"))
	newClient := clientConfig(oldCA, newCA.Client(t, "new-client"))
	if _, _, err := hello(addr, oldClient); err != nil {
		t.Fatal(err)
	}
	if _, _, err := hello(addr, newClient); err == nil {
		t.Fatal("a client of a CA not in the file yet was accepted")
	}

	newCA.WriteCA(t, dir, "clients")
	eventually(t, "after replacing the client CA", func() error {
		_, _, err := hello(addr, newClient)
		return err
	})
	if _, _, err := hello(addr, oldClient); err == nil {
		t.Fatal("a client of the CA taken out of the file is still accepted")
	}
}

func TestNewServerTLSErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	certFile, keyFile := ca.Server(t, "server").Write(t, dir, "server")
	_, otherKey := ca.Server(t, "other").Write(t, dir, "other")
	caFile := ca.WriteCA(t, dir, "ca")
	garbage := filepath.Join(dir, "garbage.pem")
	tlsconfigtest.WriteFile(t, garbage, []byte("not a pem file\n"))
	badBlock := filepath.Join(dir, "bad-block.pem")
	tlsconfigtest.WriteFile(t, badBlock, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		name          string
		cert, key, ca string
		is            error
		mentions      string
	}{
		{"no key", certFile, "", "", tlsconfig.ErrKeyPair, ""},
		{"no cert", "", keyFile, "", tlsconfig.ErrKeyPair, ""},
		{"missing cert", missing, keyFile, "", os.ErrNotExist, missing},
		{"missing CA", certFile, keyFile, missing, os.ErrNotExist, missing},
		{"key of another cert", certFile, otherKey, "", nil, otherKey},
		{"CA without certificates", certFile, keyFile, garbage, tlsconfig.ErrNoCertificate, garbage},
		{"CA with a bad block", certFile, keyFile, badBlock, nil, badBlock},
		{"cert file holds a CA only", caFile, keyFile, "", nil, caFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := tlsconfig.NewServer(tc.cert, tc.key, tc.ca, nil)
			if err == nil || cfg != nil {
				t.Fatalf("NewServer: %v, %v; want an error", cfg, err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("error %v does not wrap %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.mentions) {
				t.Fatalf("error %v does not name %s", err, tc.mentions)
			}
		})
	}
}

func TestClientTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	serverCert, serverKey := ca.Server(t, "server").Write(t, dir, "server")
	caFile := ca.WriteCA(t, dir, "ca")
	srv, err := tlsconfig.NewServer(serverCert, serverKey, caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)

	certFile, keyFile := ca.Client(t, "first").Write(t, dir, "client")
	var errs errorLog
	cfg, err := tlsconfig.NewClient(caFile, certFile, keyFile, "localhost", errs.add)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 || cfg.InsecureSkipVerify {
		t.Fatalf("client config %+v", cfg)
	}
	if _, answer, err := hello(addr, cfg); err != nil || answer != "first" {
		t.Fatalf("client cert: %q %v, want first", answer, err)
	}

	ca.Client(t, "second").Write(t, dir, "client")
	eventually(t, "after rotating the client certificate", func() error {
		_, answer, err := hello(addr, cfg)
		if err == nil && answer != "second" {
			err = errors.New("server saw " + answer)
		}
		return err
	})

	tlsconfigtest.WriteFile(t, keyFile, []byte("garbage"))
	eventually(t, "a broken client key is reported", func() error {
		_, answer, err := hello(addr, cfg)
		if err == nil && answer != "second" {
			err = errors.New("server saw " + answer)
		}
		if err == nil && len(errs.all()) == 0 {
			err = errors.New("no error reported yet")
		}
		return err
	})

	// The server name is checked: the server certificate holds no
	// "elsewhere".
	wrongName := cfg.Clone()
	wrongName.ServerName = "elsewhere"
	if _, _, err := hello(addr, wrongName); err == nil {
		t.Fatal("a server certificate for another name was accepted")
	}
	// Without the CA file the system roots do not know the test CA.
	system, err := tlsconfig.NewClient("", certFile, "", "", nil)
	if !errors.Is(err, tlsconfig.ErrKeyPair) || system != nil {
		t.Fatalf("cert without key: %v %v, want ErrKeyPair", system, err)
	}
	system, err = tlsconfig.NewClient("", "", "", "127.0.0.1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hello(addr, system); err == nil {
		t.Fatal("the system roots accepted the test CA")
	}
	if _, err := tlsconfig.NewClient(filepath.Join(dir, "missing"), "", "", "", nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing CA file: %v", err)
	}
}

// TestGRPCServerTLS: the config serves gRPC through credentials.NewTLS,
// which negotiates h2 on the per-handshake configs.
func TestGRPCServerTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := tlsconfigtest.NewCA(t, "ca")
	certFile, keyFile := ca.Server(t, "server").Write(t, dir, "server")
	cfg, err := tlsconfig.NewServer(certFile, keyFile, ca.WriteCA(t, dir, "ca"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	check := func(client *tls.Config) error {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(client)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(clientConfig(ca, ca.Client(t, "alice"))); err != nil {
		t.Fatalf("gRPC over mTLS: %v", err)
	}
	if err := check(clientConfig(ca, nil)); err == nil {
		t.Fatal("gRPC without a client certificate succeeded")
	}
}
