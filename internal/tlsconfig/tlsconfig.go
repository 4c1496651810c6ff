// Package tlsconfig builds TLS configs from PEM files and picks up new
// contents of those files without a restart.
//
// A server config ([NewServer]) answers every handshake with a config built
// from the current certificate, key and client CA files; a client config
// ([NewClient]) presents the current client certificate. The files are read
// again when a handshake finds the last look older than [CheckInterval] and
// their contents changed. A file that no longer reads or parses keeps the
// previous good material and is reported to onError, so a half-written
// rotation never takes the service down. Connections already established
// keep the certificate they were made with.
//
// Write the certificate and the key of a rotation together (a rename, or a
// Kubernetes Secret volume, does): a handshake between the two writes sees
// a certificate that does not match its key, keeps the previous pair and
// reports it; the next look loads the new pair.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

var (
	// ErrNoCertificate is wrapped by the error for a CA file without a
	// single PEM CERTIFICATE block.
	ErrNoCertificate = errors.New("no PEM certificate in file")
	// ErrKeyPair is wrapped by the error for a certificate file without its
	// key file, or a key file without its certificate file.
	ErrKeyPair = errors.New("a certificate file and a key file go together: set both or neither")
)

// NewServer returns a server config for certFile and keyFile (PEM). With
// clientCAFile (PEM, one or more CA certificates) set, clients must present
// a certificate that chains to one of them (mutual TLS); empty, clients
// present none. TLS 1.2 is the minimum.
//
// The files are read once here, and an error is returned if they do not load.
// Afterwards every handshake uses a config built from their current contents:
// see the package documentation for when they are read again. Reload errors
// go to onError, which may be nil, and must be safe for concurrent use.
//
// The config works with gRPC's credentials.NewTLS, which adds the h2
// protocol to the per-handshake configs itself.
func NewServer(certFile, keyFile, clientCAFile string, onError func(error)) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("tlsconfig: server: %w", ErrKeyPair)
	}
	parse := func(c [][]byte) (*tls.Config, error) {
		return serverConfig(certFile, keyFile, clientCAFile, c[0], c[1], c[2])
	}
	r, err := newReloader([]string{certFile, keyFile, clientCAFile}, parse, onError, CheckInterval)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: server: %w", err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.get(), nil
		},
	}, nil
}

// serverConfig is the config of one handshake, from the files' contents.
func serverConfig(certFile, keyFile, caFile string, certPEM, keyPEM, caPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.NoClientCert,
	}
	if caFile != "" {
		pool, err := certPool(caFile, caPEM)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		// A resumed session skips the client certificate check: without
		// tickets, a client CA taken out of the file stops its clients at
		// their next connection, not days later.
		cfg.SessionTicketsDisabled = true
	}
	return cfg, nil
}

// NewClient returns a client config. caFile (PEM), when set, holds the CAs
// that server certificates must chain to, instead of the system's; it is
// read once, here. certFile and keyFile (PEM, both or neither) are the
// client certificate presented to servers that ask for one; they are read
// here, then again when they change (see the package documentation), and
// reload errors go to onError, which may be nil. serverName, when set, is
// the name the server certificate must hold instead of the dialed host's.
// TLS 1.2 is the minimum.
func NewClient(caFile, certFile, keyFile, serverName string, onError func(error)) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("tlsconfig: client: %w", ErrKeyPair)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		caPEM, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: client: %w", err)
		}
		if cfg.RootCAs, err = certPool(caFile, caPEM); err != nil {
			return nil, fmt.Errorf("tlsconfig: client: %w", err)
		}
	}
	if certFile != "" {
		parse := func(c [][]byte) (*tls.Certificate, error) {
			cert, err := tls.X509KeyPair(c[0], c[1])
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", certFile, keyFile, err)
			}
			return &cert, nil
		}
		r, err := newReloader([]string{certFile, keyFile}, parse, onError, CheckInterval)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: client: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.get(), nil
		}
	}
	return cfg, nil
}

// certPool parses every CERTIFICATE block of caPEM, read from file. Unlike
// x509.CertPool.AppendCertsFromPEM it fails on a block that does not parse
// instead of skipping it.
func certPool(file string, caPEM []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := caPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: %w", file, ErrNoCertificate)
	}
	return pool, nil
}
