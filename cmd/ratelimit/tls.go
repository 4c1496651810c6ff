package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
)

// tlsFlags registers the TLS flags of the gRPC listener and the Redis client.
func tlsFlags(fs *flag.FlagSet, s *settings) {
	fs.StringVar(&s.grpcTLSCert, "grpc-tls-cert", "", "PEM certificate (chain) of the gRPC listener; with --grpc-tls-key the listener serves TLS only (1.2 minimum). Reloaded when the file changes")
	fs.StringVar(&s.grpcTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert. Reloaded when the file changes")
	fs.StringVar(&s.grpcTLSClientCA, "grpc-tls-client-ca", "", "PEM CA certificates for gRPC clients: set, every client must present a certificate they signed (mutual TLS). Needs --grpc-tls-cert. Reloaded when the file changes")
	fs.StringVar(&s.redisTLSCA, "redis-tls-ca", "", "PEM CA certificates for the Redis server's certificate, instead of the system roots (rediss:// only)")
	fs.StringVar(&s.redisTLSCert, "redis-tls-cert", "", "PEM client certificate presented to Redis (tls-auth-clients), with --redis-tls-key (rediss:// only). Reloaded when the file changes")
	fs.StringVar(&s.redisTLSKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert. Reloaded when the file changes")
	fs.StringVar(&s.redisTLSServerName, "redis-tls-server-name", "", "name the Redis server's certificate must hold, when not the --redis-url host (rediss:// only)")
	fs.StringVar(&s.grpcTLSClientSAN, "grpc-tls-client-san", "", "with --grpc-tls-client-ca: the name (DNS or IP SAN) a client certificate must hold, as envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN")
	fs.BoolVar(&s.redisTLSSkipHostnameVerification, "redis-tls-skip-hostname-verification", false, "verify the Redis server's certificate chain but not its name, as envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION (rediss:// only)")
}

// tlsSettings builds the TLS config of the gRPC listeners (nil for
// plaintext) and the Redis TLS config (nil for go-redis's default) from the
// flags. Reload failures are logged; the previous files stay in use.
func tlsSettings(s *settings, log *zap.Logger) (grpcTLS, redisTLS *tls.Config, err error) {
	switch {
	case (s.grpcTLSCert == "") != (s.grpcTLSKey == ""):
		return nil, nil, errors.New("--grpc-tls-cert and --grpc-tls-key go together: set both or neither")
	case s.grpcTLSCert != "":
		cfg, err := tlsconfig.NewServer(s.grpcTLSCert, s.grpcTLSKey, s.grpcTLSClientCA, func(err error) {
			log.Error("gRPC TLS files did not reload: serving with the previous ones", zap.Error(err))
		})
		if err != nil {
			return nil, nil, err
		}
		if s.grpcTLSClientSAN != "" {
			requireClientSAN(cfg, s.grpcTLSClientSAN)
		}
		grpcTLS = cfg
		log.Info("gRPC TLS on", zap.String("cert", s.grpcTLSCert), zap.Bool("mutual", s.grpcTLSClientCA != ""))
	case s.grpcTLSClientCA != "":
		return nil, nil, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
	}
	if s.grpcTLSClientSAN != "" && s.grpcTLSClientCA == "" {
		return nil, nil, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca")
	}

	if s.redisTLSCA == "" && s.redisTLSCert == "" && s.redisTLSKey == "" && s.redisTLSServerName == "" && !s.redisTLSSkipHostnameVerification {
		return grpcTLS, nil, nil
	}
	if !slices.ContainsFunc([]string{s.redisURL, s.redisClusterURL, s.redisSentinelURL}, func(u string) bool {
		return strings.HasPrefix(u, "rediss://")
	}) {
		return nil, nil, errors.New("--redis-tls-* flags need a rediss:// --redis-url, --redis-cluster-url or --redis-sentinel-url")
	}
	if (s.redisTLSCert == "") != (s.redisTLSKey == "") {
		return nil, nil, errors.New("--redis-tls-cert and --redis-tls-key go together: set both or neither")
	}
	cfg, err := tlsconfig.NewClient(s.redisTLSCA, s.redisTLSCert, s.redisTLSKey, s.redisTLSServerName, func(err error) {
		log.Error("Redis TLS client certificate did not reload: using the previous one", zap.Error(err))
	})
	if err != nil {
		return nil, nil, err
	}
	if s.redisTLSSkipHostnameVerification {
		skipHostnameVerification(cfg)
	}
	return grpcTLS, cfg, nil
}

// skipHostnameVerification makes cfg verify the server's chain against its
// roots (the system's when nil) but not the name in the certificate.
func skipHostnameVerification(cfg *tls.Config) {
	roots := cfg.RootCAs
	cfg.InsecureSkipVerify = true // the chain is verified below
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("redis TLS: the server sent no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, der := range raw {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return fmt.Errorf("redis TLS: server certificate: %w", err)
			}
			certs[i] = c
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, c := range certs[1:] {
			opts.Intermediates.AddCert(c)
		}
		_, err := certs[0].Verify(opts)
		return err
	}
}

// requireClientSAN makes a server config accept only client certificates
// that hold san (a DNS name or an IP address), as envoyproxy/ratelimit's
// GRPC_CLIENT_TLS_SAN does, on the config of every handshake.
func requireClientSAN(cfg *tls.Config, san string) {
	base := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := cfg
		if base != nil {
			got, err := base(hello)
			if err != nil {
				return nil, err
			}
			if got != nil {
				c = got
			}
		}
		c = c.Clone()
		c.GetConfigForClient = nil
		c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || len(chains[0]) == 0 {
				return errors.New("no verified client certificate")
			}
			if err := chains[0][0].VerifyHostname(san); err != nil {
				return fmt.Errorf("client certificate: %w", err)
			}
			return nil
		}
		return c, nil
	}
}
