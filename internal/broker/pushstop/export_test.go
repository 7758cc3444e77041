package pushstop

// SetAfterClientShutdown makes Shutdown call f between the client's
// Shutdown and its final write of the offsets.
func SetAfterClientShutdown(g *Gate, f func()) { g.afterClientShutdown = f }
