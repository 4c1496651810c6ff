package app

import (
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"

	"github.com/slidingwindow/ratelimit/internal/grpcunary"
	"github.com/slidingwindow/ratelimit/internal/metrics"
	"github.com/slidingwindow/ratelimit/internal/settings"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// streamWorkersPerCore sizes the gRPC server's pool of stream workers (see
// newGRPCServer).
const streamWorkersPerCore = 8

// grpcMinPingInterval is how often a client may ping grpc-go's server,
// with or without calls in flight. grpc-go's own policy (a ping at most
// every 5 minutes, and none while no call is in flight) would close the
// connections of an Envoy whose cluster sets connection_keepalive, which
// the lean server keeps; a flood of pings is still refused.
const grpcMinPingInterval = 5 * time.Second

// grpcPortServer is the server of the gRPC port, whichever --grpc-server
// picked: services are registered on it (reflection reads them back with
// GetServiceInfo), then it serves until stopped.
type grpcPortServer interface {
	grpc.ServiceRegistrar
	GetServiceInfo() map[string]grpc.ServiceInfo
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

var (
	_ grpcPortServer = (*grpcunary.Server)(nil)
	_ grpcPortServer = (*grpc.Server)(nil)
)

// newGRPCServer builds the gRPC port's server that s.GRPCServer names,
// with nothing registered yet. Both kinds serve with the same TLS, codec,
// interceptors (the first outermost), message bound, connection age and
// --max-inflight shedding, so that switching changes the transport alone.
//
// The codec decodes rate limit requests whatever bytes their values hold.
// The shedder refuses rate limit calls past --max-inflight once their
// message has come whole, and gives each connection its share.
// Workers: a call runs on a goroutine whose stack has already grown; a few
// per core serve as well as more, and with more the first burst after a
// start runs on never-used goroutines and is slower.
func newGRPCServer(s *settings.Settings, grpcTLS *tls.Config, codec encoding.CodecV2, shedder *transport.Shedder,
	m *metrics.Metrics, interceptors []grpc.UnaryServerInterceptor,
) (grpcPortServer, error) {
	workers := streamWorkersPerCore * runtime.GOMAXPROCS(0)
	switch s.GRPCServer {
	case settings.GRPCServerLean:
		for _, r := range grpcunary.Refusals {
			m.TransportRefusals(string(r))
		}
		return grpcunary.NewServer(grpcunary.Options{
			OnRefuse:              func(r grpcunary.Refusal) { m.TransportRefused(string(r)) },
			TLS:                   grpcTLS,
			Codec:                 codec,
			Interceptors:          interceptors,
			NewConnAdmit:          func() grpcunary.AdmitFunc { return shedder.NewConn().Admit },
			MaxRecvMsgSize:        s.MaxRequestBytes,
			MaxConnectionAge:      s.GRPCMaxConnAge,
			MaxConnectionAgeGrace: s.GRPCMaxConnAgeGrace,
			Workers:               workers,
		}), nil
	case settings.GRPCServerGRPCGo:
		// WaitForHandlers: a stop waits for handlers to return, so the
		// limiter is closed only after the calls that use it, as with
		// grpcunary's stop.
		opts := []grpc.ServerOption{
			grpc.ForceServerCodecV2(codec),
			grpc.StatsHandler(shedder.StatsHandler()),
			grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{shedder.UnaryServerInterceptor()}, interceptors...)...),
			grpc.MaxRecvMsgSize(s.MaxRequestBytes),
			grpc.MaxConcurrentStreams(grpcunary.DefaultMaxConcurrentStreams),
			// As grpcunary's: the choice of server does not change what a
			// client may send.
			grpc.MaxHeaderListSize(grpcunary.MaxHeaderListSize),
			grpc.ConnectionTimeout(grpcunary.DefaultHandshakeTimeout),
			grpc.NumStreamWorkers(uint32(workers)),
			grpc.KeepaliveParams(keepalive.ServerParameters{
				MaxConnectionAge:      orForever(s.GRPCMaxConnAge),
				MaxConnectionAgeGrace: orForever(s.GRPCMaxConnAgeGrace),
			}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
				MinTime:             grpcMinPingInterval,
				PermitWithoutStream: true,
			}),
			grpc.WaitForHandlers(true),
		}
		if grpcTLS != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(grpcTLS)))
		}
		return grpc.NewServer(opts...), nil
	}
	return nil, fmt.Errorf("--grpc-server=%s: want %s or %s", s.GRPCServer, settings.GRPCServerLean, settings.GRPCServerGRPCGo)
}

// orForever is d, or grpc-go's infinity for 0, which the connection age
// flags take as never (age) and no bound (grace), as grpcunary does.
func orForever(d time.Duration) time.Duration {
	if d == 0 {
		return time.Duration(math.MaxInt64)
	}
	return d
}
