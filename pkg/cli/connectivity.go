package cli

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tendril-net/tendril/pkg/connectivity"
	"github.com/tendril-net/tendril/pkg/controlplane"
	"github.com/tendril-net/tendril/pkg/k8s"
	"github.com/tendril-net/tendril/pkg/lab"
)

func newConnectivityCommand(*Options) *cobra.Command {
	cmd := &cobra.Command{Use: "connectivity", Short: "Check the cluster's connectivity and policy enforcement end to end"}
	cfg := connectivity.DefaultConfig()
	labName := lab.DefaultName
	if v := os.Getenv("TENDRIL_LAB"); v != "" {
		labName = v
	}
	test := &cobra.Command{
		Use:   "test",
		Short: "Deploy test pods and Services and check pod-to-pod (same and other node), pod-to-host, ClusterIP and allow/deny policy cases",
		Long: `Deploys its own namespace of pods on two nodes of the lab, checks TCP, UDP and
ICMP between them and to the nodes, then three ClusterIP Services in front of the
servers (who answers: both backends, one with ClientIP affinity, the local one
with internalTrafficPolicy Local), then applies a TendrilNetworkPolicy and a
Kubernetes NetworkPolicy and checks what they allow and deny, and that deleting
them restores connectivity. A progress line per check, then a table; exit 1 if
any check failed. Needs root (probes run inside the pods' network namespaces).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("tendril connectivity test needs root (it probes from inside the lab's pods)")
			}
			st, err := lab.LoadState(labName)
			if err != nil {
				return fmt.Errorf("lab %s: %w (is it up? tendril lab up)", labName, err)
			}
			if cfg, err = connectivity.LabConfig(st, cfg); err != nil {
				return err
			}
			rc, err := controlplane.RESTConfig(st.Kubeconfig)
			if err != nil {
				return err
			}
			clients, err := k8s.NewClientsForConfig(rc)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			results, err := connectivity.Test(ctx, clients, connectivity.LabProber{State: st}, cfg, cmd.OutOrStdout())
			if len(results) > 0 {
				connectivity.PrintTable(cmd.OutOrStdout(), results)
			}
			if err != nil {
				return err
			}
			if n := connectivity.Failed(results); n > 0 {
				return &ExitError{Code: 1, Msg: fmt.Sprintf("%d of %d connectivity checks failed", n, len(results))}
			}
			return nil
		},
	}
	test.Flags().StringVar(&labName, "lab", labName, "Lab to test (env TENDRIL_LAB)")
	test.Flags().StringVar(&cfg.Namespace, "namespace", cfg.Namespace, "Namespace of the test's pods and policies (recreated)")
	test.Flags().StringVar(&cfg.Phases, "phases", cfg.Phases, "Run only the phases whose title contains this text (e.g. IPv6); empty: all")
	test.Flags().BoolVar(&cfg.Keep, "keep", cfg.Keep, "Leave the test namespace in place afterwards")
	test.Flags().DurationVar(&cfg.Settle, "settle", cfg.Settle, "How long a check may retry until policy has reached the nodes")
	test.Flags().IntVar(&cfg.DenyProbes, "deny-probes", cfg.DenyProbes, "How many probes in a row a denied check needs dropped; once one is, any that gets through fails the check")
	cmd.AddCommand(test)
	return cmd
}
