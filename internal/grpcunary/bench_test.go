package grpcunary

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkUnaryCall is a small unary call from a grpc-go client in the same
// process, 50 at a time, served by this package and, for comparison, by
// grpc-go's server: both figures include the client's work.
func BenchmarkUnaryCall(b *testing.B) {
	b.Run("grpcunary", func(b *testing.B) {
		_, cc := start(b, Options{}, &testService{})
		benchmarkUnaryCall(b, cc)
	})
	b.Run("grpc-go", func(b *testing.B) {
		s := grpc.NewServer()
		testgrpc.RegisterTestServiceServer(s, &testService{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		benchmarkUnaryCall(b, cc)
		if err := cc.Close(); err != nil {
			b.Error(err)
		}
		s.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			b.Error(err)
		}
	})
}

func benchmarkUnaryCall(b *testing.B, cc *grpc.ClientConn) {
	client := testgrpc.NewTestServiceClient(cc)
	req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("a rate limit request of about this size")}}
	b.SetParallelism(25)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.UnaryCall(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
