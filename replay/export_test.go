package replay

// ReplayMessage builds the message a replay sends (replayMessage).
var ReplayMessage = replayMessage
