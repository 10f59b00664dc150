package workload

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
)

// RunCommand parses a workload's command line (--pod-name, --tcp,
// --udp, --ready-fd, --address, --report-peer) and serves until ctx
// ends. Both `tendril lab workload` and the small tendril-workload binary
// run it: the lab starts one process per pod, and a binary that links
// only this package starts in a few milliseconds where the whole CLI
// spends about 150 ms of CPU in its package initialisers.
func RunCommand(ctx context.Context, name string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s --pod-name NAME --tcp PORTS --udp PORTS [--address ADDR] [--report-peer] [--ready-fd FD]\n\n"+
			"A lab pod's server: answers every TCP connection and UDP datagram with the pod's name.\n\nFlags:\n", name)
		fs.PrintDefaults()
	}
	podName := fs.String("pod-name", "", "The name to answer with")
	tcp := fs.String("tcp", "", "TCP ports, comma-separated")
	udp := fs.String("udp", "", "UDP ports, comma-separated")
	readyFD := fs.Int("ready-fd", 0, "File descriptor to write a line to once every port listens")
	address := fs.String("address", "", "Listen on this address only (default: every address)")
	reportPeer := fs.Bool("report-peer", false, "Answer with the name and the source address and port the connection came from (the lab's world server)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	s := &Server{Name: *podName, ReportPeer: *reportPeer, Address: *address, Log: slog.New(slog.NewTextHandler(stderr, nil))}
	var err error
	if s.TCPPorts, err = ParsePorts(*tcp); err != nil {
		return fmt.Errorf("--tcp: %w", err)
	}
	if s.UDPPorts, err = ParsePorts(*udp); err != nil {
		return fmt.Errorf("--udp: %w", err)
	}
	return s.Serve(ctx, func() {
		if *readyFD <= 0 {
			return
		}
		f := os.NewFile(uintptr(*readyFD), "ready")
		_, _ = f.WriteString("ready\n")
		_ = f.Close()
	})
}
