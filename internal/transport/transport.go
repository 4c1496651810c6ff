// Package transport is what the rate limit service's gRPC and HTTP ports
// need around the service itself: shedding past --max-inflight (Shedder,
// and Conn, a connection's hold on its places; shedder.go), for grpcunary's
// server, grpc-go's and POST /json alike, the bound on the gRPC port's
// connections (LimitListener, connlimit.go), and the gRPC codec of the rate
// limit requests (NewCodec, codec.go), which keeps descriptor values' bytes
// as sent and allocates within the request bounds.
//
// The dependency goes one way: internal/app imports this package and
// internal/service and wires them together (giving the codec the bounds it
// gives the service); this package imports neither of them (its tests use
// internal/service, to check the codec against the service's validation),
// and internal/service does not import it; what it counts goes to an
// Observer (internal/metrics, wired by app). What the codec produces is
// Envoy's own RateLimitRequest, which the service reads as it would any
// other.
package transport

// Observer counts what this package refuses and holds (internal/metrics'
// Metrics is one); nil counts nothing.
type Observer interface {
	// Shed counts a request refused past --max-inflight.
	Shed()
	// TransportRefused counts a refusal by the gRPC port's bounds, for a
	// reason such as RefusedConnection.
	TransportRefused(reason string)
	// GRPCConnections counts connections opened (delta 1) and closed (-1).
	GRPCConnections(delta int)
}

// RefusedConnection is the refusal reason of a connection past
// --max-connections.
const RefusedConnection = "connections"

// observer is m, or one that counts nothing.
func observer(m Observer) Observer {
	if m == nil {
		return unobserved{}
	}
	return m
}

type unobserved struct{}

func (unobserved) Shed()                   {}
func (unobserved) TransportRefused(string) {}
func (unobserved) GRPCConnections(int)     {}
