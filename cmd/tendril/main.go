// Command tendril is Tendril's command line interface.
package main

import (
	"os"

	"github.com/tendril-net/tendril/pkg/cli"
)

func main() {
	os.Exit(cli.Main())
}
