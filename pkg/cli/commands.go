package cli

import "github.com/spf13/cobra"

// commandConstructors lists the subcommands beyond status, config and
// version, in help order. Each capability adds its constructor here.
func commandConstructors() []func(*Options) *cobra.Command {
	return []func(*Options) *cobra.Command{
		newEndpointCommand,
		newIPAMCommand,
		newPolicyCommand,
		newIdentityCommand,
		newServiceCommand,
		newIPCommand,
		newConnectivityCommand,
		newBPFCommand,
		newLabCommand,
		newObserveCommand,
		newStateDBCommand,
		newRelayCommand,
		newUICommand,
		newCNICommand,
		newMetricsCommand,
		newHealthCommand,
		newBGPCommand,
		newLRPCommand,
		newPrefilterCommand,
		newFQDNCommand,
		newEncryptCommand,
	}
}
