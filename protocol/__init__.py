"""What the parts of CES say to each other, and nothing else: the one package the Master, the edge
agent, the SDN app and the worker program share. Standard library only, so an edge host needs
nothing of the scheduler, the emulation or a controller framework to run its agent.

  messages  the Master <-> agent messages (dataclasses that travel as JSON, checked on arrival)
  http      one small HTTP/JSON server and client (routing, body limits, timeouts, bearer tokens)
  worker    the contract between an agent and the training program it starts
"""
