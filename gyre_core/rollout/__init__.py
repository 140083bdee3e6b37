"""The rollout side: engines that serve the policy, the router, the agent harness."""
