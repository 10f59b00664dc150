package wireguard

import (
	"net/http"

	"github.com/tendril-net/tendril/api/v1/server"
)

// RotateResponse is POST /v1/encrypt/rotate-key's answer.
type RotateResponse struct {
	// PublicKey is the node's new public key.
	PublicKey string `json:"publicKey"`
}

// apiHandlers serves POST /v1/encrypt/rotate-key: a new key for this
// node, set on the device and published (Encryption.RotateKey); 501 with
// encryption off.
func apiHandlers(e *Encryption) server.HandlersOut {
	return server.Handlers(func(api *server.Server) {
		api.Handle(http.MethodPost, "/v1/encrypt/rotate-key", func(w http.ResponseWriter, r *http.Request) error {
			if e == nil {
				return server.Errorf(http.StatusNotImplemented, "encryption disabled (--enable-wireguard=false)")
			}
			if err := e.RotateKey(r.Context()); err != nil {
				return server.Errorf(http.StatusInternalServerError, "rotate the WireGuard key: %v", err)
			}
			key, _ := e.WireGuardPublicKey()
			server.WriteJSON(w, http.StatusOK, RotateResponse{PublicKey: key})
			return nil
		})
	})
}
