//! The command line of an agent: its own flags to run it, or a tool named instead.
//!
//! Each agent declares a `clap::Parser` with `args_conflicts_with_subcommands` and
//! `subcommand_negates_reqs`, its tools as subcommands and its flags flattened beside them.
//! Reading that declaration back goes through [`Invocation`], not the parser's own fields:
//! clap leaves an `Option` of flattened flags `None` when those flags nest flattened groups of
//! their own (telemetry, runtime), as both agents' do.

use clap::{CommandFactory, FromArgMatches};

/// What a command line asks for: run the agent with flags `A`, or the tool `T`.
#[derive(Debug)]
pub enum Invocation<A, T> {
    /// Run the agent.
    Agent(Box<A>),
    /// Run a tool instead.
    Tool(T),
}

impl<A: FromArgMatches, T: FromArgMatches> Invocation<A, T> {
    /// Parses `argv` (the binary's name first) as declared by `C`; `--help`, `--version` and
    /// mistakes come back as clap's error, which `exit()` prints.
    pub fn try_parse_from<C, I, S>(argv: I) -> Result<Self, clap::Error>
    where
        C: CommandFactory,
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let matches = C::command().try_get_matches_from(argv)?;
        if matches.subcommand_name().is_some() {
            Ok(Self::Tool(T::from_arg_matches(&matches)?))
        } else {
            // No tool named: clap has checked the agent's required flags.
            Ok(Self::Agent(Box::new(A::from_arg_matches(&matches)?)))
        }
    }

    /// The process's own command line as declared by `C`; exits with clap's message on
    /// `--help`, `--version` or a mistake.
    pub fn parse<C: CommandFactory>() -> Self {
        Self::try_parse_from::<C, _, _>(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }
}
