// Loaded into every pi episode (`pi -e`): a `bash` call whose `timeout` is zero or negative is
// refused with an error naming the value, where pi would run it with no time limit at all.
// A positive timeout and a missing one keep pi's own meaning. The message comes from the
// project (envs/tools.py `bad_timeout_message`) through RLVR_BAD_TIMEOUT_MESSAGE.
export default function (pi) {
  pi.on("tool_call", async (event) => {
    const timeout = event.toolName === "bash" ? event.input?.timeout : undefined;
    if (typeof timeout === "number" && !(timeout > 0)) {
      const template = process.env.RLVR_BAD_TIMEOUT_MESSAGE;
      return { block: true, reason: template.replace("{value}", String(timeout)) };
    }
  });
}
