package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/tlsconfig"
)

// tlsSettings builds the TLS config of the gRPC listeners (nil for
// plaintext) and the Redis TLS config (nil for go-redis's default) from
// validated settings (whose table refuses flags that do not go together).
// Reload failures are logged; the previous files stay in use.
func tlsSettings(s *settings.Settings, log *zap.Logger) (grpcTLS, redisTLS *tls.Config, err error) {
	if g := s.GRPCTLS; g.Cert != "" {
		cfg, err := tlsconfig.NewServer(g.Cert, g.Key, g.ClientCA, func(err error) {
			log.Error("gRPC TLS files did not reload: serving with the previous ones", zap.Error(err))
		})
		if err != nil {
			return nil, nil, err
		}
		if g.ClientSAN != "" {
			requireClientSAN(cfg, g.ClientSAN)
		}
		grpcTLS = cfg
		log.Info("gRPC TLS on", zap.String("cert", g.Cert), zap.Bool("mutual", g.ClientCA != ""))
	}
	r := s.RedisTLS
	if r == (settings.RedisTLS{}) {
		return grpcTLS, nil, nil
	}
	cfg, err := tlsconfig.NewClient(r.CA, r.Cert, r.Key, r.ServerName, func(err error) {
		log.Error("Redis TLS client certificate did not reload: using the previous one", zap.Error(err))
	})
	if err != nil {
		return nil, nil, err
	}
	if r.SkipHostnameVerification {
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
